"""Per-round logging of a run to TensorBoard or MLflow, besides ``rounds.csv`` (off by default).

A *round logger* has two methods: ``log_round(row)``, called with each finished round's row
(the ``on_round`` callback of :func:`fairclip.sims.executors.loop.simulate`, or through
:class:`LoggerObserver`), and ``close(summary)``, called once with the run's summary. Every
finite number of the row is logged as a scalar at step ``row["round"]`` under its column name
(``clip_bound``, ``epsilon``, ``minority/accuracy``, ...); rounds that were not evaluated hold
NaN there and are skipped. A library user passes a logger's
``log_round`` to :func:`simulate` directly::

    logger = TensorBoardLogger("runs/tb/adaptive")
    result = simulate(config, task, on_round=logger.log_round)
    logger.close(result.summary)

The loggers record what the run's rows hold: a simulation's rows include its simulation-only
diagnostics (true clipping fractions, update norms), which is fine for a researcher's own
simulation. The Flower ServerApp does not use them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from fairclip.scenarios.errors import ConfigError


class RoundLogger(Protocol):
    """Receives each finished round, then the summary."""

    def log_round(self, row: Mapping[str, Any]) -> None: ...

    def close(self, summary: Mapping[str, Any]) -> None: ...


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a round's row (booleans and the round number itself left out)."""
    values = {}
    for key, value in row.items():
        if key == "round" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            values[key] = float(value)
    return values


def flat_parameters(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested configuration as ``{"policy.name": "bounded", ...}`` (values as text)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_parameters(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


def _summary_scalars(summary: Mapping[str, Any]) -> dict[str, float]:
    values = {"final/" + key: value for key, value in scalars(summary).items()}
    for cohort, metrics in (summary.get("cohorts") or {}).items():
        values.update({f"final/{cohort}/{key}": value for key, value in scalars(metrics).items()})
    return values


class TensorBoardLogger:
    """Scalars into a TensorBoard event file in ``log_dir`` (torch's ``SummaryWriter``; needs
    the ``tensorboard`` package)."""

    def __init__(self, log_dir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "--tensorboard needs the tensorboard package (pip install tensorboard)"
            ) from None
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log_round(self, row: Mapping[str, Any]) -> None:
        step = int(row["round"])
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self, summary: Mapping[str, Any]) -> None:
        step = int(summary.get("rounds_completed") or 0)
        for key, value in _summary_scalars(summary).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.add_text("status", str(summary.get("status", "")), global_step=step)
        self.writer.close()


class MLflowLogger:
    """One MLflow run: the configuration as parameters, each round's scalars as metrics at step
    t, the summary's numbers as ``final/...`` metrics. Tracking goes where MLflow's own settings
    say (``MLFLOW_TRACKING_URI``; MLflow's default otherwise); needs ``mlflow`` (or
    ``mlflow-skinny``)."""

    def __init__(self, experiment: str, run_name: str, config: Mapping[str, Any] | None = None):
        try:
            import mlflow
        except ImportError:
            raise ConfigError("--mlflow needs the mlflow package (pip install mlflow-skinny)") from None
        self.mlflow = mlflow
        mlflow.set_experiment(experiment)
        self.run = mlflow.start_run(run_name=run_name)
        if config:
            mlflow.log_params(flat_parameters(config))

    def log_round(self, row: Mapping[str, Any]) -> None:
        values = scalars(row)
        if values:
            self.mlflow.log_metrics(values, step=int(row["round"]))

    def close(self, summary: Mapping[str, Any]) -> None:
        step = int(summary.get("rounds_completed") or 0)
        self.mlflow.log_metrics(_summary_scalars(summary), step=step)
        status = "FINISHED" if summary.get("status") == "finished" else "KILLED"
        self.mlflow.end_run(status=status)


def require_packages(tensorboard: bool, mlflow: bool) -> None:
    """Before any work: the packages of the loggers asked for are importable (one line if not)."""
    import importlib.util

    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard needs the tensorboard package (pip install tensorboard)")
    if mlflow and importlib.util.find_spec("mlflow") is None:
        raise ConfigError("--mlflow needs the mlflow package (pip install mlflow-skinny)")


def log_finished_run(
    tensorboard: Path | None, mlflow_experiment: str | None, run_name: str, result: Mapping[str, Any]
) -> None:
    """Log a run that finished elsewhere (a ``compare`` run in a Ray worker) round by round:
    ``result`` holds its ``rows`` and ``summary``."""
    summary = result["summary"]
    loggers = round_loggers(tensorboard, mlflow_experiment, run_name, summary.get("config") or {})
    for row in result["rows"]:
        for logger in loggers:
            logger.log_round(row)
    for logger in loggers:
        logger.close(summary)


def round_loggers(
    tensorboard: Path | None, mlflow_experiment: str | None, run_name: str, config: Mapping[str, Any]
) -> list[RoundLogger]:
    """The loggers a command line asked for (none by default), made before any work so that a
    missing package is one line."""
    loggers: list[RoundLogger] = []
    if tensorboard is not None:
        loggers.append(TensorBoardLogger(tensorboard / run_name))
    if mlflow_experiment is not None:
        loggers.append(MLflowLogger(mlflow_experiment, run_name, config))
    return loggers


class LoggerObserver:
    """A round logger as a run observer (:class:`fairclip.server.observers.RunObserver`): each
    round's row to ``log_round``, the run's summary to ``close`` at the end."""

    def __init__(self, logger: RoundLogger) -> None:
        self.logger = logger

    def on_round(self, row: Mapping[str, Any], run: Any) -> None:
        self.logger.log_round(row)

    def on_finish(self, run: Any) -> None:
        self.logger.close(run.summary)


def log_rounds(loggers: Iterable[RoundLogger]) -> Callable[[Mapping[str, Any]], None]:
    """One ``on_round`` callback that hands a row to every logger."""
    loggers = list(loggers)

    def log_round(row: Mapping[str, Any]) -> None:
        for logger in loggers:
            logger.log_round(row)

    return log_round
