"""What an executor needs from a scenario: clients, cohorts, local updates and evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fairclip.scenarios.data import DataError
from fairclip.scenarios.data.federated_dataset import load_federated_dataset
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.tasks.mean_estimation import MeanEstimationTask

if TYPE_CHECKING:
    from fairclip.scenarios.config import RunConfig


class Task(Protocol):
    """A federated task: the population of clients and how they train and are evaluated.

    A task may also define ``per_example_gradients(model, client_ids, round_number, policy)``,
    returning the norms and weighted sums of those clients' updates without forming them (a
    :class:`fairclip.scenarios.tasks.ghost.OneStepGradients`), or ``None`` where it cannot; the executors use
    it first (:meth:`fairclip.scenarios.tasks.classification.ClassificationTask.per_example_gradients`).

    A task may define ``begin_round(model, client_ids, round_number)``: the executor calls it with
    each round's sampled clients before any of them trains (a training objective of the whole
    batch, ``training.objective = "fairlens"``, computes its batch term there).

    And ``group_metrics(model)``: extra (overall, per-cohort) metrics of the final model, such as
    :meth:`fairclip.scenarios.tasks.classification.ClassificationTask.group_metrics`'s group-fairness rates,
    merged into the summary once a run, or ``None``.

    :func:`build_task` sets ``cohort_directions`` (``training.cohort_directions``): the executors
    then also sum each cohort's unclipped and clipped updates for the direction and magnitude
    diagnostics (:class:`fairclip.strategies.aggregation.CohortDiagnostics`); and
    ``unclipped_total`` (``training.clipping_error`` other than ``both``): they also sum the raw
    updates of all clients, for :func:`fairclip.scenarios.tasks.clipping_errors.keep_one_error`."""

    cohort_names: list[str]
    client_cohorts: np.ndarray
    """Cohort index of each of the N clients."""
    rows_per_call: int
    """How many clients' updates ``local_updates`` computes best in one call: the one-step path's
    vectorised batch; 1 where clients train one after the other."""

    def initial_model(self) -> np.ndarray:
        """θ_0 as a flat float64 vector."""

    def local_updates(self, model: np.ndarray, client_ids: np.ndarray, round_number: int) -> np.ndarray:
        """Raw updates Δ_i = θ_i − θ_t of the given clients, one row each."""

    def evaluate(self, model: np.ndarray) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """(global metrics, per-cohort metrics) of ``model``. A run publishes them as
        post-processing of the released model, so they may read only data no client holds (a
        held-out test set, the scenario's settings), never the clients' own examples."""

    def summary(self, model: np.ndarray) -> dict[str, Any]:
        """Task-specific entries of ``summary.json`` for the final model, published as
        :meth:`evaluate`'s metrics are: from the model and public data only."""

    def keep_clients(self, owned: np.ndarray) -> None:
        """Keep only the clients ``owned`` (a boolean mask over the N clients) and their data;
        ``local_updates`` of any other client raises afterwards. The Ray executor's actors call it
        with the clients of the summation blocks they hold, and only where ``rows_per_call`` is 1
        (:func:`fairclip.sims.executors.ray.owns_clients`): other tasks need not implement it."""

    def worker(self) -> Task:
        """A view of this task that another thread can call ``local_updates`` on at the same time:
        it shares the clients and their data, not mutable state such as the model."""


def build_task(config: RunConfig, data_dir: Path | None = None) -> Task:
    """The task of a scenario (real datasets are read from ``data_dir``).

    A scenario that its data cannot satisfy (a cohort left without clients, too few examples)
    raises :class:`ConfigError`; missing or corrupt files raise ``DataError``.
    """
    task = _build(config, data_dir)
    if config.evaluation.clients:
        try:
            task.hold_out(config.evaluation.holdout, config.seed)  # type: ignore[attr-defined]
        except (AttributeError, ValueError) as error:
            why = str(error) if isinstance(error, ValueError) else "its task holds no examples to evaluate"
            raise ConfigError(f"scenario {config.scenario.name!r}: {why}") from None
    task.cohort_directions = config.training.cohort_directions  # type: ignore[attr-defined]
    task.unclipped_total = config.training.clipping_error != "both"  # type: ignore[attr-defined]
    if config.training.objective == "fairlens":
        from fairclip.scenarios.tasks.fairlens import FairLens  # torch: only a task that trains

        gradient_weight, boundary_weight = config.training.fairlens_weights
        bound = float(config.policy.params["initial_bound"])
        try:
            task.use_objective(FairLens(gradient_weight, boundary_weight, bound))  # type: ignore[attr-defined]
        except ValueError as error:
            raise ConfigError(f"scenario {config.scenario.name!r}: {error}") from None
    return task


def _build(config: RunConfig, data_dir: Path | None) -> Task:

    try:
        if config.scenario.task == "mean-estimation":
            return MeanEstimationTask(config.scenario, config.federation.num_clients, config.seed)
        # torch: only a task that trains (mean estimation and the command line's checks stay light)
        from fairclip.scenarios.tasks.classification import ClassificationTask, model_factory

        if config.scenario.task == "federated-dataset":
            scenario = config.scenario
            data = load_federated_dataset(
                scenario.dataset, scenario.options, config.federation.num_clients, config.seed
            )
            return ClassificationTask.from_dataset(
                data, config.training, config.seed, model_factory(scenario.model)
            )

        return ClassificationTask(
            config.scenario, config.training, config.federation.num_clients, config.seed, data_dir
        )
    except DataError:
        raise
    except ValueError as error:
        raise ConfigError(f"scenario {config.scenario.name!r}: {error}") from None
