"""The ``mean-estimation`` task behind ``bimodal-mean`` (seed 000, Figure 1, left).

Client i of cohort k holds one point x_i = c_k + spread_k · z_i, z_i ~ N(0, I_d); the model is
μ, and the update is x_i − μ (:func:`local_updates`). Cohort sizes come from
:func:`fairclip.scenarios.data.cohort_client_counts`; cohort k's clients are a contiguous run of ids
(:class:`fairclip.scenarios.data.generated_clients.CohortRanges`).

The task is evaluated as a classification task is on its test set: on data no client holds.
Here that is each cohort's distribution, a scenario setting. Per cohort it reports the distance
||μ − c_k|| and the expected loss on a fresh point of the cohort,

    L_k(μ) = E ½||x − μ||² = ½(||μ − c_k||² + d·spread_k²),

and overall the loss Σ_k (n_k/N) L_k(μ) and the distance to the population's mean
μ* = Σ_k (n_k/N) c_k (seed 000's "true mean", 0.4 for ``bimodal-mean``). Every one is a function of
the released μ and the scenario's settings alone, so the run publishes them as post-processing.
The clients' own points are never read for them: their exact mean or loss would be a statistic
of the private data that DP does not cover (with three clients, one cohort's loss gives away its
one client's point).

A population whose points would take more than
:data:`fairclip.scenarios.data.generated_clients.GENERATE_ABOVE_BYTES` (N × d × 8 bytes) holds none:
client i's z_i is drawn from its own generator (seed, DATA, 2, i) when it is sampled, so a round
costs what its sampled clients cost, whatever N.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from fairclip.scenarios.config import ScenarioSpec
from fairclip.scenarios.data import cohort_client_counts
from fairclip.scenarios.data.generated_clients import CLIENT_KEY, GENERATE_ABOVE_BYTES, CohortRanges
from fairclip.strategies.randomness import Stream, rng


def local_updates(points: np.ndarray, model: np.ndarray) -> np.ndarray:
    """A client's local work: one step of gradient descent on ½||x_i − μ||² with learning rate 1,
    Δ_i = x_i − μ, for each row x_i of ``points``."""
    return np.asarray(points, dtype=np.float64) - np.asarray(model, dtype=np.float64)[None, :]


def generates_points(dimension: int, num_clients: int) -> bool:
    """Whether the clients' points are drawn when sampled rather than held (module docstring)."""
    return num_clients * dimension * 8 > GENERATE_ABOVE_BYTES


class MeanEstimationTask:
    """Each client holds one point; the model is their mean."""

    rows_per_call = 2**16
    """Updates are x_i − μ, exact whatever the batch: one call for a round's clients (64 calls of
    a few rows each cost ``bimodal-mean`` 3.5× its rounds). So the Ray actors keep every point
    (:func:`fairclip.sims.executors.ray.owns_clients`) and this task needs no ``keep_clients``."""

    def __init__(self, scenario: ScenarioSpec, num_clients: int, seed: int):
        self.seed = seed
        self.dimension = scenario.dimension
        self.cohort_names = list(scenario.cohorts)
        self.centres = np.array(
            [
                np.broadcast_to(np.asarray(c.centre, dtype=np.float64), (self.dimension,))
                for c in scenario.cohorts.values()
            ]
        )
        self.spreads = np.array([c.spread for c in scenario.cohorts.values()], dtype=np.float64)
        sizes = np.asarray(cohort_client_counts([c.share for c in scenario.cohorts.values()], num_clients))
        self.cohort_sizes = sizes
        self.client_cohorts = CohortRanges(np.cumsum(sizes))
        self.points: np.ndarray | None = None
        """The N points where they are held; ``None`` where they are drawn when sampled."""
        if not generates_points(self.dimension, num_clients):
            points = rng(seed, Stream.DATA).standard_normal((num_clients, self.dimension))
            for cohort in range(len(sizes)):  # in place: c_k + spread_k · z_i, cohort by cohort
                members = self.client_cohorts.members(cohort)
                block = points[members.start : members.stop]
                block *= self.spreads[cohort]
                block += self.centres[cohort]
            self.points = points

    @property
    def draws_points(self) -> bool:
        """Whether the points are drawn when sampled (a population too large to hold)."""
        return self.points is None

    def client_points(self, client_ids: np.ndarray) -> np.ndarray:
        """x_i of ``client_ids``: held, or drawn from each client's own generator."""
        if self.points is not None:
            return self.points[client_ids]
        client_ids = np.asarray(client_ids, dtype=np.int64)
        cohorts = self.client_cohorts[client_ids]
        noise = np.empty((len(client_ids), self.dimension))
        for row, client in enumerate(client_ids.tolist()):
            noise[row] = rng(self.seed, Stream.DATA, CLIENT_KEY, client).standard_normal(self.dimension)
        return self.centres[cohorts] + self.spreads[cohorts][:, None] * noise

    def initial_model(self) -> np.ndarray:
        return np.zeros(self.dimension)

    def local_updates(self, model: np.ndarray, client_ids: np.ndarray, round_number: int) -> np.ndarray:
        return local_updates(self.client_points(client_ids), model)

    def worker(self) -> MeanEstimationTask:
        """Local updates only read the points: threads can share this task."""
        return self

    def _cohort_losses(self, model: np.ndarray) -> np.ndarray:
        """L_k(μ) = ½(||μ − c_k||² + d·spread_k²): the expected ½||x − μ||² of a fresh point of
        each cohort (module docstring)."""
        offsets = np.sum((self.centres - model[None, :]) ** 2, axis=1)
        return 0.5 * (offsets + self.dimension * self.spreads**2)

    @functools.cached_property
    def population_mean(self) -> np.ndarray:
        """μ* = Σ_k (n_k/N) c_k: the mean of the population's distribution (scenario settings, not
        the clients' points)."""
        return (self.cohort_sizes[:, None] * self.centres).sum(0) / self.cohort_sizes.sum()

    def evaluate(self, model: np.ndarray) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """Each cohort's distance ||μ − c_k|| and loss L_k(μ); overall Σ_k (n_k/N) L_k(μ), ||μ − μ*||
        and, in one dimension, μ itself: functions of μ and the scenario alone (module docstring)."""
        losses = self._cohort_losses(model)
        per_cohort = {
            name: {
                "distance": float(np.linalg.norm(model - self.centres[index])),
                "loss": float(losses[index]),
            }
            for index, name in enumerate(self.cohort_names)
        }
        overall = {
            "loss": float(np.sum(losses * self.cohort_sizes) / self.cohort_sizes.sum()),
            "distance_to_mean": float(np.linalg.norm(model - self.population_mean)),
        }
        if self.dimension == 1:
            overall["estimate"] = float(model[0])
        return overall, per_cohort

    def summary(self, model: np.ndarray) -> dict[str, Any]:
        return {
            "estimate": [float(v) for v in model],
            "population_mean": [float(v) for v in self.population_mean],
            "points": "drawn per sampled client" if self.draws_points else "held",
        }
