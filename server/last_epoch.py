"""Each cohort's training loss and update norm over the last epoch, as the papers' tables take them.

Two readings of "the loss at the last epoch" (``training.train_loss``):

* ``"last-epoch"``, seed 003's (Esipova et al. 2023, the Loss columns of their Tables 2-5), from
  their code's ``final_loss_per_group`` (layer6ai-labs/fair-dp, ``trainers/trainer.py``,
  ``_train_epoch`` and ``get_losses_per_group``): in each batch of the last epoch, before the
  step, the mean cross-entropy of the batch's examples of group k under the current model θ_t
  (0 where the batch holds none of them), summed over the epoch's batches and divided by their
  number E::

      L_k = (1 / E) · Σ_{t in the last epoch} mean_{i in B_t, a_i = k} ℓ(θ_t; x_i, y_i)

  A group absent from a batch lowers L_k, as in their code: for a group of a few examples per
  batch (MNIST's class 8) that is a visible part of their number.

* ``"last-epoch-examples"``, seed 004's (Xu et al. 2021, Table 2: "the average loss ... w.r.t.
  groups at the last training epoch"): every example of the epoch's batches counts once::

      L_k = Σ_t Σ_{i in B_t, a_i = k} ℓ(θ_t; x_i, y_i) / Σ_t |{i in B_t : a_i = k}|

  as the code seed 004's runs build on (Bagdasaryan et al., ebagdasa/differential-privacy-vs-
  fairness, ``playing.py`` ``train_dp``) averages its per-class gradient norms over an epoch:
  one list per class, one entry per example, ``np.mean``.

With either, also each cohort's mean update norm before clipping over the same rounds, one
entry per sampled client::

    N_k = Σ_t Σ_{i in B_t, a_i = k} ||Δ_i|| / Σ_t |{i in B_t : a_i = k}|

and the norm of the cohort's mean update in each batch, averaged over the epoch's batches that
hold the cohort::

    G_k = mean_{t : B_t holds k} || (1 / |B_t,k|) Σ_{i in B_t,k} Δ_i ||

This is seed 004's "average gradient norm" (Table 2, Figures 1, 2, 4, 6, 7): its section 4.2
names G_B = (1/b) Σ_i g_i of a batch "the average gradient", and its Line 14 aims the bounds at
"the relative size of the average gradient" of each group. For clients of one example that take
one local step at client learning rate 1 (seed 004's setups), Δ_i is minus the per-example
gradient. The server forms each batch's cohort sums Σ_{i in B_t,k} Δ_i itself, in the last
epoch's rounds only, from the updates the clients train in that round
(:meth:`fairclip.scenarios.tasks.classification.ClassificationTask.cohort_update_sums`): 2K
model-sized sums per summation block in every round (``training.cohort_directions``, which
kept them before 2026-12-06) cost ``xu-cnn`` 16 s a round against 0.6 s without. With Poisson
batches of rate q, an epoch is E = ⌈1/q⌉ rounds (Opacus' data loader of rate 1/len(loader)).

All of these are simulation-only diagnostics of the clients' data, not covered by DP
(:meth:`fairclip.server.run.Run.finish`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fairclip.strategies.clipping import row_norms

LAST_EPOCH = "last-epoch"
"""``training.train_loss``'s value for seed 003's batch-mean estimate."""

LAST_EPOCH_EXAMPLES = "last-epoch-examples"
"""``training.train_loss``'s value for seed 004's per-example estimate."""

WEIGHTINGS = (LAST_EPOCH, LAST_EPOCH_EXAMPLES)


class LastEpoch:
    """The running sums of the last epoch's cohort losses and update norms (module docstring)."""

    def __init__(self, num_cohorts: int, sample_rate: float, weighting: str = LAST_EPOCH):
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS} (got {weighting!r})")
        self.weighting = weighting
        self.epoch_rounds = max(1, math.ceil(1.0 / sample_rate - 1e-9))
        """E = ⌈1/q⌉: the rounds of an epoch."""
        self.loss_sums = np.zeros(num_cohorts)
        """Σ over the rounds noted of each batch's cohort mean (``"last-epoch"``) or of its
        cohort sum (``"last-epoch-examples"``)."""
        self.loss_counts = np.zeros(num_cohorts)
        """The examples behind ``loss_sums`` (``"last-epoch-examples"``)."""
        self.norm_sums = np.zeros(num_cohorts)
        self.norm_counts = np.zeros(num_cohorts)
        self.mean_norm_sums = np.zeros(num_cohorts)
        self.mean_norm_batches = np.zeros(num_cohorts)
        """Σ over the noted batches that hold cohort k of G_k's terms, and how many."""
        self.rounds = 0
        """Rounds whose losses were noted."""

    def first_round(self, last_round: int) -> int:
        """The first round of the epoch that ends with ``last_round`` (1 for a shorter run)."""
        return max(1, last_round - self.epoch_rounds + 1)

    def wants(self, round_number: int, last_round: int) -> bool:
        """Whether round ``round_number`` belongs to the last epoch of a run that ends with
        ``last_round`` (asked each round: a resume may end the run earlier than planned)."""
        return round_number >= self.first_round(last_round)

    def add(self, loss_sums: np.ndarray, counts: np.ndarray) -> None:
        """One batch's summed loss per cohort under θ_t and its examples per cohort."""
        sums = np.asarray(loss_sums, dtype=np.float64)
        counts = np.asarray(counts, dtype=np.float64)
        if self.weighting == LAST_EPOCH:
            self.loss_sums += np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)
        else:
            self.loss_sums += sums
            self.loss_counts += counts
        self.rounds += 1

    def add_norms(self, norm_sums: np.ndarray, clients: np.ndarray) -> None:
        """One round's Σ ||Δ_i|| before clipping per cohort and its sampled clients per cohort."""
        self.norm_sums += np.asarray(norm_sums, dtype=np.float64)
        self.norm_counts += np.asarray(clients, dtype=np.float64)

    def add_batch_updates(self, cohort_sums: np.ndarray, clients: np.ndarray) -> None:
        """One round's Σ Δ_i per cohort (K × d) and its sampled clients per cohort: a term
        ||Σ_{i in B_t,k} Δ_i|| / |B_t,k| of G_k for each cohort the batch holds."""
        clients = np.asarray(clients, dtype=np.float64)
        held = clients > 0
        lengths = row_norms(cohort_sums)  # float64, no overflow, no BLAS
        self.mean_norm_sums[held] += lengths[held] / clients[held]
        self.mean_norm_batches[held] += 1

    def losses(self) -> np.ndarray:
        """L_k for each cohort (NaN before any round, and for a cohort no example of which was
        seen under ``"last-epoch-examples"``)."""
        if self.weighting == LAST_EPOCH:
            return self.loss_sums / self.rounds if self.rounds else np.full(self.loss_sums.shape, math.nan)
        return _mean(self.loss_sums, self.loss_counts)

    def update_norms(self) -> np.ndarray:
        """N_k for each cohort (NaN for a cohort no client of which was seen)."""
        return _mean(self.norm_sums, self.norm_counts)

    def mean_update_norms(self) -> np.ndarray:
        """G_k for each cohort (NaN for a cohort no batch held)."""
        return _mean(self.mean_norm_sums, self.mean_norm_batches)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (:meth:`fairclip.server.run.Run.snapshot`)."""
        return {
            "sums": self.loss_sums.copy(),
            "counts": self.loss_counts.copy(),
            "norm_sums": self.norm_sums.copy(),
            "norm_counts": self.norm_counts.copy(),
            "mean_norm_sums": self.mean_norm_sums.copy(),
            "mean_norm_batches": self.mean_norm_batches.copy(),
            "rounds": self.rounds,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from ``state``. A checkpoint written before the norms were kept holds none:
        its norms then start at the next round, and where it had noted rounds already they are
        unknown (NaN), never an average over part of the epoch. So is G_k where the noted rounds
        added no term of it (a run without ``training.cohort_directions`` before 2026-12-06)."""
        self.loss_sums = np.asarray(state["sums"], dtype=np.float64).copy()
        self.loss_counts = np.asarray(
            state.get("counts", np.zeros_like(self.loss_sums)), dtype=np.float64
        ).copy()
        self.rounds = int(state["rounds"])
        if "norm_sums" in state:
            self.norm_sums = np.asarray(state["norm_sums"], dtype=np.float64).copy()
            self.norm_counts = np.asarray(state["norm_counts"], dtype=np.float64).copy()
            self.mean_norm_sums = np.asarray(state["mean_norm_sums"], dtype=np.float64).copy()
            self.mean_norm_batches = np.asarray(state["mean_norm_batches"], dtype=np.float64).copy()
            if self.rounds and not self.mean_norm_batches.any():
                self.mean_norm_sums = np.full(self.loss_sums.shape, math.nan)
        elif self.rounds:
            self.norm_sums = np.full(self.loss_sums.shape, math.nan)
            self.mean_norm_sums = np.full(self.loss_sums.shape, math.nan)


def _mean(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """sums / counts, NaN where a count is 0 (the division never sees a 0)."""
    return np.where(counts > 0, sums / np.maximum(counts, 1), math.nan)
