"""What an engine needs from a scenario: clients, cohorts, local updates and evaluation."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Task(Protocol):
    """A federated task: the population of clients and how they train and are evaluated."""

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
        """(global metrics, per-cohort metrics) of ``model``."""

    def summary(self, model: np.ndarray) -> dict[str, Any]:
        """Task-specific entries of ``summary.json`` for the final model."""

    def worker(self) -> Task:
        """A view of this task that another thread can call ``local_updates`` on at the same time:
        it shares the clients and their data, not mutable state such as the model."""
