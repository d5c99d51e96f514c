"""Each cohort's training loss as seed 003's authors take it: over the last epoch's batches.

Esipova et al. (2023) report per-group training losses (the Loss columns of their Tables 2-5)
from their code's ``final_loss_per_group`` (layer6ai-labs/fair-dp, ``trainers/trainer.py``,
``_train_epoch`` and ``get_losses_per_group``): in each batch of the last epoch, before the
step, the mean cross-entropy of the batch's examples of group k under the current model θ_t
(0 where the batch holds none of them), summed over the epoch's batches and divided by their
number E:

    L_k = (1 / E) · Σ_{t in the last epoch} mean_{i in B_t, a_i = k} ℓ(θ_t; x_i, y_i)

With Poisson batches of rate q, an epoch is E = ⌈1/q⌉ rounds (Opacus' data loader of rate
1/len(loader)). A group absent from a batch lowers L_k, as in their code: for a group of a few
examples per batch (MNIST's class 8) that is a visible part of their number.

``training.train_loss = "last-epoch"`` gives this; ``true`` gives each cohort's loss over all its
training examples under the final model. Either is a simulation-only diagnostic of the clients'
data, not covered by DP (:meth:`fairclip.server.run.Run.finish`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

LAST_EPOCH = "last-epoch"
"""``training.train_loss``'s value for this estimate."""


class LastEpochLosses:
    """The running sums of the last epoch's per-batch cohort means (module docstring)."""

    def __init__(self, num_cohorts: int, sample_rate: float):
        self.epoch_rounds = max(1, math.ceil(1.0 / sample_rate - 1e-9))
        """E = ⌈1/q⌉: the rounds of an epoch."""
        self.sums = np.zeros(num_cohorts)
        self.rounds = 0

    def first_round(self, last_round: int) -> int:
        """The first round of the epoch that ends with ``last_round`` (1 for a shorter run)."""
        return max(1, last_round - self.epoch_rounds + 1)

    def wants(self, round_number: int, last_round: int) -> bool:
        """Whether round ``round_number`` belongs to the last epoch of a run that ends with
        ``last_round`` (asked each round: a resume may end the run earlier than planned)."""
        return round_number >= self.first_round(last_round)

    def add(self, batch_means: np.ndarray) -> None:
        """One batch's mean loss per cohort under θ_t (NaN where the batch holds none: 0)."""
        self.sums += np.nan_to_num(np.asarray(batch_means, dtype=np.float64), nan=0.0)
        self.rounds += 1

    def means(self) -> np.ndarray:
        """L_k for each cohort: the sums over the epoch's rounds noted, divided by their number
        (NaN before any)."""
        return self.sums / self.rounds if self.rounds else np.full(self.sums.shape, math.nan)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (:meth:`fairclip.server.run.Run.snapshot`)."""
        return {"sums": self.sums.copy(), "rounds": self.rounds}

    def restore(self, state: dict[str, Any]) -> None:
        self.sums = np.asarray(state["sums"], dtype=np.float64).copy()
        self.rounds = int(state["rounds"])
