"""The ``mean-estimation`` task behind ``bimodal-mean`` (seed 000, Figure 1, left).

Client i of cohort k holds one point x_i = c_k + spread_k · z_i, z_i ~ N(0, I_d); the model is
μ, and the update is x_i − μ (:mod:`fairclip.client.mean_estimation`). Cohort sizes come from
:func:`fairclip.sims.data.cohort_client_counts`. Per cohort the task reports the
distance ||μ − c_k|| and the loss ½·mean ||x_i − μ||² over the cohort's clients.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fairclip.client.mean_estimation import local_updates
from fairclip.sims.config import ScenarioSpec
from fairclip.sims.data import cohort_client_counts
from fairclip.strategies.randomness import Stream, rng


class MeanEstimationTask:
    """Each client holds one point; the model is their mean."""

    rows_per_call = 2**16
    """Updates are x_i − μ, exact whatever the batch: one call for a round's clients (64 calls of
    a few rows each cost ``bimodal-mean`` 3.5× its rounds). So the Ray actors keep every point
    (:func:`fairclip.sims.ray_engine.owns_clients`) and this task needs no ``keep_clients``."""

    def __init__(self, scenario: ScenarioSpec, num_clients: int, seed: int):
        generator = rng(seed, Stream.DATA)
        self.dimension = scenario.dimension
        self.cohort_names = list(scenario.cohorts)
        self.centres = np.array(
            [
                np.broadcast_to(np.asarray(c.centre, dtype=np.float64), (self.dimension,))
                for c in scenario.cohorts.values()
            ]
        )
        sizes = cohort_client_counts([c.share for c in scenario.cohorts.values()], num_clients)
        self.client_cohorts = np.repeat(np.arange(len(sizes)), sizes)
        spreads = np.array([c.spread for c in scenario.cohorts.values()])[self.client_cohorts]
        noise = generator.standard_normal((num_clients, self.dimension))
        self.points = self.centres[self.client_cohorts] + spreads[:, None] * noise

    def initial_model(self) -> np.ndarray:
        return np.zeros(self.dimension)

    def local_updates(self, model: np.ndarray, client_ids: np.ndarray, round_number: int) -> np.ndarray:
        return local_updates(self.points[client_ids], model)

    def worker(self) -> MeanEstimationTask:
        """Local updates only read the points: threads can share this task."""
        return self

    def evaluate(self, model: np.ndarray) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        squared = np.sum((self.points - model[None, :]) ** 2, axis=1)
        per_cohort = {}
        for index, name in enumerate(self.cohort_names):
            members = self.client_cohorts == index
            per_cohort[name] = {
                "distance": float(np.linalg.norm(model - self.centres[index])),
                "loss": float(0.5 * squared[members].mean()) if members.any() else float("nan"),
            }
        overall = {
            "loss": float(0.5 * squared.mean()),
            "distance_to_mean": float(np.linalg.norm(model - self.points.mean(0))),
        }
        if self.dimension == 1:
            overall["estimate"] = float(model[0])
        return overall, per_cohort

    def summary(self, model: np.ndarray) -> dict[str, Any]:
        return {
            "estimate": [float(v) for v in model],
            "population_mean": [float(v) for v in self.points.mean(0)],
        }
