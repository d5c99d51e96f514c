"""One seed fixes everything (docs/design.md, section 6): named, independent random streams.

Each stream is keyed by (seed, purpose, round, ...) rather than drawn from one sequential
generator, so the draws of a round do not depend on how many draws an engine made before it,
nor on which process makes them: the in-process and Ray engines see the same numbers.
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


def rng(seed: int, stream: Stream, *keys: int) -> np.random.Generator:
    """The generator for ``stream`` under ``seed`` and further integer keys (round, client id)."""
    return np.random.default_rng([int(seed), int(stream), *(int(key) for key in keys)])


def poisson_sample(seed: int, round_number: int, num_clients: int, sample_rate: float) -> np.ndarray:
    """Ids of the clients that join round ``round_number``: each independently with probability q."""
    draws = rng(seed, Stream.SAMPLING, round_number).random(num_clients)
    return np.flatnonzero(draws < sample_rate)
