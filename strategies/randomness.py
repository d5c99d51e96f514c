"""One seed fixes everything (docs/design.md, section 6): named, independent random streams.

Each stream is keyed by (seed, purpose, round, ...) rather than drawn from one sequential
generator, so the draws of a round do not depend on how many draws an executor made before it,
nor on which process makes them: the in-process and Ray executors see the same numbers.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    """Purposes of random numbers; each gets its own stream."""

    DATA = 0
    SAMPLING = 1
    CLIENT = 2
    NOISE = 3
    EVALUATION_SAMPLING = 4
    """The clients that evaluate the model after a reporting round (``[evaluation] clients``)."""
    EVALUATION_NOISE = 5
    """The noise of their released evaluation sums (never the round's training noise)."""
    EVALUATION_DATA = 6
    """Which of a simulated client's examples it holds out for evaluation."""
    DROPOUT = 7
    """The dropout masks of a training call (by round and the call's first client)."""


def rng(seed: int, stream: Stream, *keys: int) -> np.random.Generator:
    """The generator for ``stream`` under ``seed`` and further integer keys (round, client id)."""
    return np.random.default_rng([int(seed), int(stream), *(int(key) for key in keys)])


DENSE_SAMPLING_MAX = 2**24
"""Populations up to this size are sampled with one uniform draw per client (128 MiB of draws at
most, 0.1 s); larger ones without touching every client (:func:`sample_ids`)."""


def poisson_sample(
    seed: int | None,
    round_number: int,
    num_clients: int,
    sample_rate: float,
    stream: Stream = Stream.SAMPLING,
) -> np.ndarray:
    """Ids of the clients that join round ``round_number``: each independently with probability q,
    drawn from the run's ``seed`` (stream ``SAMPLING``, round t; ``EVALUATION_SAMPLING`` for the
    clients that evaluate the model after it) or, without one, from the operating system's
    entropy. Every sample of fairclip (the run, the Flower DP wrapper) is this."""
    generator = rng(seed, stream, round_number) if seed is not None else np.random.default_rng()
    return sample_ids(generator, num_clients, sample_rate)


def sample_ids(generator: np.random.Generator, num_clients: int, sample_rate: float) -> np.ndarray:
    """Sorted ids of a Poisson sample: every client of ``num_clients`` independently with
    probability ``sample_rate``.

    Up to :data:`DENSE_SAMPLING_MAX` clients, one uniform draw per client (u_i < q). Beyond, the
    same distribution in O(qN) time and memory: the sample's size is Binomial(N, q), and given
    its size a Poisson sample is a uniformly random subset of that size (``Generator.choice``
    without replacement, which does not materialise the population). A billion clients at
    q = 10⁻⁵: under 1 ms and no memory beyond the ids."""
    if num_clients <= DENSE_SAMPLING_MAX:
        return np.flatnonzero(generator.random(num_clients) < sample_rate)
    count = int(generator.binomial(num_clients, sample_rate))
    return np.sort(generator.choice(num_clients, size=count, replace=False))
