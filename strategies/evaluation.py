"""Per-cohort evaluation on the clients' own held-out data, under user-level DP (issue 69, section 2).

Each client i of cohort k(i) evaluates the released model on at most m of its held-out examples
(``evaluation.max_examples``, a public constant; a seeded subset where it holds more) and sends
one vector of length 3K (K cohorts) -- in its own cohort's slot, zeros elsewhere::

    v_i[3k(i) : 3k(i)+3] = (c_i, n_i, l_i),   c_i = # correct,  n_i = # examples,
                                               l_i = Σ_j min(max(ℓ_j, 0), L)   (loss clipped to [0, L])

with 0 <= c_i <= n_i <= m and 0 <= l_i <= n_i·L. Adding or removing one client changes the sum
Σ_i v_i by one such vector, so the L2 sensitivity of the sum is::

    Δ_E = max ||v_i|| = sqrt(m² + m² + (m·L)²) = m · sqrt(2 + L²)

The server releases Σ_i v_i + N(0, (σ_E Δ_E)² I) (the Gaussian mechanism with noise multiplier
σ_E = ``evaluation.noise_multiplier``, on a Poisson sample of clients at the run's rate q): one
more step of the run's accountant, a sampled Gaussian mechanism with multiplier σ_E. A vector
outside that set (a faulty or hostile client) is dropped (:func:`admitted`), which is removing
one client: the bound holds for every vector that reaches the sum. Everything published from the
noisy sums is post-processing (:func:`noisy_metrics`): per cohort, accuracy = noisy c / noisy n
and loss = noisy l / noisy n, each NaN where the noisy count n is <= 0 and otherwise clipped to
its range ([0, 1], [0, L]); and the accuracy gap (max − min over the cohorts with a finite
accuracy).

Pure numpy, like the policies: the client side (which builds the vector), the server side
(which checks and releases it) and the executors (which sum it in fixed blocks) share it; the
vector is a plain sum, so it can go through a masked (secure) sum unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fairclip.strategies.base import GaussianSampler, as_sampler

FIELDS = ("correct", "examples", "loss")
"""The three entries of a cohort's slot, in order."""


def sensitivity(max_examples: int, loss_bound: float) -> float:
    """Δ_E = m · sqrt(2 + L²), the larger of two roundings of it and then one ulp more (so that
    no rounding can put a checked vector's norm above it)."""
    if not (isinstance(max_examples, int | np.integer) and max_examples >= 1):
        raise ValueError(f"max_examples must be an integer >= 1 (got {max_examples!r})")
    if not (math.isfinite(loss_bound) and loss_bound > 0):
        raise ValueError(f"loss_bound must be a finite number > 0 (got {loss_bound!r})")
    m = float(max_examples)
    largest = max(math.hypot(m, m, m * float(loss_bound)), m * math.sqrt(2.0 + float(loss_bound) ** 2))
    return math.nextafter(largest, math.inf)


def contribution(
    cohort: int,
    num_cohorts: int,
    correct: np.ndarray,
    losses: np.ndarray,
    max_examples: int,
    loss_bound: float,
) -> np.ndarray:
    """One client's vector (module docstring) from its per-example correctness and losses (in
    the order of its held-out examples, of which the first ``max_examples`` count: the caller
    orders them, a seeded shuffle in simulations). A loss that is not finite counts as L."""
    if not 0 <= cohort < num_cohorts:
        raise ValueError(f"cohort {cohort} is not one of {num_cohorts}")
    correct = np.asarray(correct, dtype=bool)[:max_examples]
    losses = np.asarray(losses, dtype=np.float64)[:max_examples]
    if correct.shape != losses.shape:
        raise ValueError(f"{correct.shape} correctness values for {losses.shape} losses")
    examples = correct.size
    clipped = np.clip(np.where(np.isfinite(losses), losses, loss_bound), 0.0, loss_bound)
    vector = np.zeros(3 * num_cohorts)
    vector[3 * cohort : 3 * cohort + 3] = (
        float(correct.sum()),
        float(examples),
        min(float(clipped.sum()), examples * float(loss_bound)),
    )
    return vector


def problem(vector: np.ndarray, num_cohorts: int, max_examples: int, loss_bound: float) -> str | None:
    """Why ``vector`` is not a contribution of :func:`contribution`'s form (``None`` where it is):
    length 3K, finite, at most one cohort's slot nonzero, and in that slot
    0 <= correct <= examples <= m and 0 <= loss <= examples·L."""
    vector = np.asarray(vector)
    if vector.shape != (3 * num_cohorts,):
        return f"evaluation vector of shape {vector.shape}, expected ({3 * num_cohorts},)"
    if not np.issubdtype(vector.dtype, np.number) or not np.isfinite(vector).all():
        return "evaluation vector is not finite"
    slots = vector.reshape(num_cohorts, 3).astype(np.float64)
    nonzero = np.flatnonzero(np.any(slots != 0, axis=1))
    if nonzero.size > 1:
        return f"evaluation vector fills {nonzero.size} cohorts' slots, at most one allowed"
    if nonzero.size == 0:
        return None
    correct, examples, loss = slots[nonzero[0]]
    if not (0 <= correct <= examples <= max_examples):
        return (
            f"evaluation counts {correct:g} correct of {examples:g} outside "
            f"0 <= correct <= examples <= {max_examples}"
        )
    if not (0 <= loss <= examples * loss_bound):
        return f"evaluation loss sum {loss:g} outside [0, {examples:g} x {loss_bound:g}]"
    return None


def admitted(vector: np.ndarray, num_cohorts: int, max_examples: int, loss_bound: float) -> np.ndarray:
    """``vector`` where :func:`problem` finds nothing wrong, else zeros (the client dropped):
    every admitted vector has norm <= :func:`sensitivity`."""
    if problem(vector, num_cohorts, max_examples, loss_bound) is None:
        return np.asarray(vector, dtype=np.float64)
    return np.zeros(3 * num_cohorts)


def release(
    total: np.ndarray,
    noise: np.random.Generator | GaussianSampler,
    noise_multiplier: float,
    max_examples: int,
    loss_bound: float,
    rounding_slack: float = 0.0,
) -> tuple[np.ndarray, float]:
    """(Σ v_i + N(0, (σ_E Δ_E (1+ρ))² I), the noise's standard deviation) from the sampler
    ``noise`` (numpy's generator, or OpenDP's exact sampler in a deployment). ``rounding_slack``
    ρ > 0 where the sum was a secure one of quantised vectors, each within Δ_E(1+ρ)
    (:class:`fairclip.strategies.secure_sum.Layout`); 0 for a sum of checked vectors."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"the evaluation's noise multiplier must be > 0 (got {noise_multiplier!r})")
    if not (math.isfinite(rounding_slack) and rounding_slack >= 0):
        raise ValueError(f"rounding_slack must be >= 0 (got {rounding_slack!r})")
    bound = sensitivity(max_examples, loss_bound) * (1.0 + float(rounding_slack))
    return as_sampler(noise).add_noise(np.asarray(total, dtype=np.float64), noise_multiplier, bound)


def cohort_metrics(
    sums: np.ndarray, cohort_names: Sequence[str], loss_bound: float
) -> dict[str, dict[str, float]]:
    """Per cohort: ``client_accuracy``, ``client_loss`` and ``client_examples`` from (noisy or
    exact) sums of contributions; accuracy and loss NaN where the count is <= 0, else clipped to
    [0, 1] and [0, L] (post-processing)."""
    slots = np.asarray(sums, dtype=np.float64).reshape(len(cohort_names), 3)
    found = {}
    for name, (correct, examples, loss) in zip(cohort_names, slots, strict=True):
        counted = examples > 0
        found[name] = {
            "client_accuracy": float(np.clip(correct / examples, 0.0, 1.0)) if counted else math.nan,
            "client_loss": float(np.clip(loss / examples, 0.0, loss_bound)) if counted else math.nan,
            "client_examples": float(examples),
        }
    return found


def accuracy_gap(per_cohort: dict[str, dict[str, float]]) -> float:
    """max − min of the finite ``client_accuracy`` values (NaN where there is none)."""
    accuracies = [m["client_accuracy"] for m in per_cohort.values() if math.isfinite(m["client_accuracy"])]
    return float(max(accuracies) - min(accuracies)) if accuracies else math.nan


def block_sum(vectors: np.ndarray, num_cohorts: int, max_examples: int, loss_bound: float) -> np.ndarray:
    """Σ of one summation block's clients' vectors (one row each, in id order), each
    :func:`admitted` first; added one after the other from zeros, so every executor (and the
    Flower server) forms the same bits (:mod:`fairclip.strategies.aggregation`'s fixed blocks)."""
    total = np.zeros(3 * num_cohorts)
    for vector in np.asarray(vectors, dtype=np.float64).reshape(-1, 3 * num_cohorts):
        total = total + admitted(vector, num_cohorts, max_examples, loss_bound)
    return total


def add_blocks(blocks: Sequence[np.ndarray], num_cohorts: int) -> np.ndarray:
    """Σ of the blocks' sums, in block order."""
    total = np.zeros(3 * num_cohorts)
    for block in blocks:
        total = total + block
    return total
