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
    cohorts = np.asarray(cohorts, dtype=np.int64)
    reports = policy.client_side(updates, cohorts, params)

    def per_cohort(values: np.ndarray) -> np.ndarray:
        return np.bincount(cohorts, weights=values.astype(np.float64), minlength=num_cohorts)

    diagnostics = CohortDiagnostics(
        sampled=per_cohort(np.ones(len(cohorts))),
        exceeded=per_cohort(reports.exceeded),
        nonfinite=per_cohort(reports.nonfinite),
        norm_before=per_cohort(reports.norms),
        norm_after=per_cohort(reports.contribution_norms),
        norms=tuple(np.asarray(reports.norms, dtype=np.float64)[cohorts == k] for k in range(num_cohorts)),
    )
    return RoundSums(
        contribution_sum=reports.contributions.sum(axis=0),
        report_sum=reports.reports.sum(axis=0),
        num_reports=int(updates.shape[0]),
        diagnostics=diagnostics,
    )
