"""fairclip from Python: one simulation in a call, its results as pandas tables.

A first step of the public API (issue 19): :func:`simulate` runs a built-in scenario or a
scenario file with typed overrides, in this process, and returns a :class:`Simulation` --
``rounds`` (one row per round, the columns of ``rounds.csv``), ``cohorts`` (one row per
cohort, the final metrics), the privacy claim and the final model. ``fairclip run`` writes the
same numbers for the same configuration and seed::

    import fairclip
    result = fairclip.simulate("demo", overrides={"strategy.name": "adaptive", "training.rounds": 20})
    result.cohorts["accuracy"]       # per cohort
    result.epsilon, result.privacy   # ε, and δ, the accountant, q, T and the noise multipliers

Nothing is written to disk; pass ``on_round`` (for example a logger of
:mod:`fairclip.sims.tracking`) to see each round as it finishes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Simulation:
    """What one simulated run produced."""

    rounds: pd.DataFrame
    """One row per finished round, indexed by ``round`` (the columns of ``rounds.csv``)."""
    cohorts: pd.DataFrame
    """One row per cohort, indexed by its name: the final model's metrics."""
    summary: dict[str, Any]
    """Everything ``summary.json`` holds: the resolved configuration, ε, provenance, status."""
    model: np.ndarray
    """The final model (flattened parameters), the one ``summary`` and ``cohorts`` describe."""

    @property
    def epsilon(self) -> float:
        """ε spent at ``privacy["delta"]`` (∞ for the non-private ``none``)."""
        value = self.summary["epsilon"]
        return math.inf if value == "inf" else float(value)

    @property
    def privacy(self) -> dict[str, Any]:
        """The privacy claim: ε with δ, the accountant, q, T and the noise multipliers."""
        return dict(self.summary["privacy"])


def simulate(
    scenario: str | None = None,
    *,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    data_dir: str | Path | None = None,
    workers: int = 1,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> Simulation:
    """Run one simulation in this process and return its results.

    ``scenario`` names a built-in scenario (``fairclip scenarios``) and ``config_file`` a
    scenario TOML (one of the two); ``overrides`` sets dotted configuration keys to typed
    values (``{"strategy.name": "bounded", "privacy.target_epsilon": 2.0}``), validated like
    ``--set``; ``data_dir`` holds the real datasets (default: ``FAIRCLIP_DATA``); ``workers``
    threads train the sampled clients (the same result for any number). An invalid
    configuration raises :class:`fairclip.sims.errors.ConfigError` naming the problem.
    """
    from fairclip.sims.config import scenario_source, set_value, validate
    from fairclip.sims.engine import LocalExecutor, build_task
    from fairclip.sims.engine import simulate as run_rounds
    from fairclip.sims.errors import ConfigError

    if workers < 1:
        raise ConfigError(f"workers must be >= 1 (got {workers})")
    raw = scenario_source(scenario, Path(config_file) if config_file is not None else None)
    for key, value in (overrides or {}).items():
        raw = set_value(raw, key, value)
    config = validate(raw)
    task = build_task(config, Path(data_dir) if data_dir is not None else None)
    result = run_rounds(
        config, task, lambda task, policy: LocalExecutor(task, policy, workers), on_round=on_round
    )
    rounds = pd.DataFrame(result.rows)
    if not rounds.empty:
        rounds = rounds.set_index("round")
    cohorts = pd.DataFrame.from_dict(result.summary["cohorts"], orient="index")
    cohorts.index.name = "cohort"
    return Simulation(rounds=rounds, cohorts=cohorts, summary=result.summary, model=np.asarray(result.model))
