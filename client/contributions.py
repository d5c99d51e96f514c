"""The client side of a round for a group of clients, summed the way the server receives it.

:func:`contribute` applies the policy's client transform to the raw updates of some clients
(one client in a Flower ``ClientApp``, a shard in a Ray actor, all sampled clients in the
in-process engine) and returns the sums that go to the server, plus per-cohort diagnostics
that only a simulation may record (true counts and update norms; a real client never reports
its raw norm).
"""

from __future__ import annotations

import numpy as np

from fairclip.strategies import Policy
from fairclip.strategies.aggregation import CohortDiagnostics, RoundSums
from fairclip.strategies.base import Broadcast


def contribute(
    policy: Policy, params: Broadcast, updates: np.ndarray, cohorts: np.ndarray, num_cohorts: int
) -> RoundSums:
    """Clip the raw ``updates`` (one row per client) with ``policy`` and sum what they send."""
    updates = np.atleast_2d(np.asarray(updates, dtype=np.float64))
    return contribute_blocks(policy, params, updates, cohorts, num_cohorts, [updates.shape[0]])[0]


def contribute_blocks(
    policy: Policy,
    params: Broadcast,
    updates: np.ndarray,
    cohorts: np.ndarray,
    num_cohorts: int,
    sizes: list[int],
) -> list[RoundSums]:
    """:func:`contribute` for consecutive blocks of rows (``sizes[j]`` rows each) at once: the
    policy's client side runs once over all rows (it acts on each client's row alone), then each
    block is summed on its own rows -- the same sums as one call per block, bit for bit, without
    the per-call cost that 64 small blocks a round would pay."""
    updates = np.atleast_2d(np.asarray(updates, dtype=np.float64))
    cohorts = np.asarray(cohorts, dtype=np.int64)
    reports = policy.client_side(updates, cohorts, params)
    norms = np.asarray(reports.norms, dtype=np.float64)
    sums = []
    start = 0
    for size in sizes:
        rows = slice(start, start + size)
        start += size
        block_cohorts = cohorts[rows]

        def per_cohort(values: np.ndarray, rows: slice = rows, block_cohorts: np.ndarray = block_cohorts):
            return np.bincount(
                block_cohorts, weights=np.asarray(values[rows], dtype=np.float64), minlength=num_cohorts
            )

        block_norms = norms[rows]
        diagnostics = CohortDiagnostics(
            sampled=np.bincount(block_cohorts, minlength=num_cohorts).astype(np.float64),
            exceeded=per_cohort(reports.exceeded),
            nonfinite=per_cohort(reports.nonfinite),
            norm_before=per_cohort(norms),
            norm_after=per_cohort(reports.contribution_norms),
            norms=tuple(block_norms[block_cohorts == k] for k in range(num_cohorts)),
        )
        sums.append(
            RoundSums(
                contribution_sum=reports.contributions[rows].sum(axis=0),
                report_sum=reports.reports[rows].sum(axis=0),
                num_reports=size,
                diagnostics=diagnostics,
            )
        )
    if start != updates.shape[0]:
        raise ValueError(f"blocks of {start} rows for {updates.shape[0]} updates")
    return sums
