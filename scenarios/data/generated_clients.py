"""Synthetic populations too large to hold: each client's examples generated from its id.

A synthetic classification scenario whose clients' examples would take more than
:data:`GENERATE_ABOVE_BYTES` (N × examples per client × features × 4 bytes) holds none of them.
Client i of cohort k draws its examples from cohort k's distribution
(:func:`fairclip.scenarios.data.synthetic.sample_cohort`) with its own generator, keyed by (seed, i), when
it is sampled; cohorts are contiguous runs of ids (:class:`CohortRanges`). The cost of a round
then depends on the clients sampled, not on N: a billion clients take no more memory than a
thousand. The examples are a different draw of the same distributions than a held population's
(whose clients share one generator), so the threshold is part of the scenario's data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairclip.scenarios.config import ClassificationSpec
from fairclip.scenarios.data import cohort_client_counts
from fairclip.scenarios.data.synthetic import sample_cohort
from fairclip.strategies.randomness import Stream, rng

GENERATE_ABOVE_BYTES = 2**30
"""Synthetic clients whose examples would take more than this are generated when sampled."""

CLIENT_KEY, TEST_KEY = 2, 3
"""Keys of the generators of client i (seed, DATA, 2, i) and of the test set (seed, DATA, 3)."""


def generates_clients(spec: ClassificationSpec, num_clients: int) -> bool:
    """Whether the scenario's clients are generated from their ids (:data:`GENERATE_ABOVE_BYTES`)."""
    stored = num_clients * spec.examples_per_client * spec.features * 4
    return spec.dataset == "synthetic" and stored > GENERATE_ABOVE_BYTES


@dataclass(frozen=True)
class CohortRanges:
    """The cohort of each of N clients when cohort k holds the ids ``ends[k-1] <= i < ends[k]``:
    indexed like an array of N cohort labels (``cohorts[ids]``, ``len(cohorts)``) without one."""

    ends: np.ndarray

    def __len__(self) -> int:
        return int(self.ends[-1])

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    def __getitem__(self, ids):
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self)):
            raise IndexError(f"client ids must lie in 0..{len(self) - 1}")
        return np.searchsorted(self.ends, ids, side="right").astype(np.int64)

    def members(self, cohort: int) -> range:
        """The ids of ``cohort``'s clients."""
        start = 0 if cohort == 0 else int(self.ends[cohort - 1])
        return range(start, int(self.ends[cohort]))


class GeneratedClients:
    """A synthetic scenario's population, each client's examples generated when asked."""

    def __init__(self, spec: ClassificationSpec, num_clients: int, seed: int):
        self.seed = seed
        self.features = spec.features
        self.examples_per_client = spec.examples_per_client
        self.cohort_names = list(spec.cohorts)
        cohorts = list(spec.cohorts.values())
        self.distributions = [cohort.synthetic for cohort in cohorts]
        sizes = cohort_client_counts([cohort.share for cohort in cohorts], num_clients)
        self.client_cohorts = CohortRanges(np.cumsum(sizes))
        generator = rng(seed, Stream.DATA, TEST_KEY)
        parts = [
            sample_cohort(distribution, spec.features, spec.test_examples_per_cohort, generator)
            for distribution in self.distributions
        ]
        self.test_x = np.concatenate([x for x, _ in parts])
        self.test_y = np.concatenate([y for _, y in parts])
        owner = np.repeat(np.arange(len(cohorts)), spec.test_examples_per_cohort)
        self.cohort_weights = {name: (owner == k).astype(np.float64) for k, name in enumerate(spec.cohorts)}
        self.num_classes = 2

    def examples(self, client_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The examples (float32 features, int64 labels) of ``client_ids``, client after client."""
        client_ids = np.asarray(client_ids, dtype=np.int64)
        cohorts = self.client_cohorts[client_ids]
        parts = [
            sample_cohort(
                self.distributions[cohort],
                self.features,
                self.examples_per_client,
                rng(self.seed, Stream.DATA, CLIENT_KEY, client),
            )
            for client, cohort in zip(client_ids.tolist(), cohorts.tolist(), strict=True)
        ]
        if not parts:
            return np.empty((0, self.features), dtype=np.float32), np.empty(0, dtype=np.int64)
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])
