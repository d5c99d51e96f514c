"""The client side of a round for a group of clients, summed the way the server receives it.

:func:`contribute` applies the policy's client transform to the raw updates of some clients
(one client in a Flower ``ClientApp``, a shard in a Ray actor, all sampled clients in the
in-process engine) and returns the sums that go to the server, plus per-cohort diagnostics
that only a simulation may record (true counts and update norms; a real client never reports
its raw norm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairclip.strategies import Policy
from fairclip.strategies.base import Broadcast


@dataclass
class CohortDiagnostics:
    """Simulation-only sums per cohort (arrays of length K), and each cohort's update norms
    before clipping (``norms[k]``, one value per client; ``()`` where they are not known) for
    the per-cohort median, which no sum gives."""

    sampled: np.ndarray
    exceeded: np.ndarray
    nonfinite: np.ndarray
    norm_before: np.ndarray
    norm_after: np.ndarray
    norms: tuple[np.ndarray, ...] = ()

    @classmethod
    def zeros(cls, num_cohorts: int) -> CohortDiagnostics:
        return cls(*(np.zeros(num_cohorts) for _ in range(5)), tuple(np.empty(0) for _ in range(num_cohorts)))

    def __add__(self, other: CohortDiagnostics) -> CohortDiagnostics:
        known = bool(self.norms) and bool(other.norms)
        return CohortDiagnostics(
            self.sampled + other.sampled,
            self.exceeded + other.exceeded,
            self.nonfinite + other.nonfinite,
            self.norm_before + other.norm_before,
            self.norm_after + other.norm_after,
            tuple(map(np.concatenate, zip(self.norms, other.norms, strict=True))) if known else (),
        )

    def median_norm(self, cohort: int) -> float:
        """Median update norm (before clipping) of cohort ``cohort``'s clients; NaN where none
        were sampled or the norms are not known."""
        if not self.norms or self.norms[cohort].size == 0:
            return float("nan")
        return float(np.median(self.norms[cohort]))


@dataclass
class RoundSums:
    """What the server receives from a group of clients: sums only."""

    contribution_sum: np.ndarray
    report_sum: np.ndarray
    num_reports: int
    diagnostics: CohortDiagnostics

    def __add__(self, other: RoundSums) -> RoundSums:
        return RoundSums(
            self.contribution_sum + other.contribution_sum,
            self.report_sum + other.report_sum,
            self.num_reports + other.num_reports,
            self.diagnostics + other.diagnostics,
        )


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


SUM_SHARDS = 8
"""Clients are summed in this many fixed blocks of ids, in block order, on every backend, so that
the floating-point sum -- and with it the whole run -- is the same whether the blocks are
computed here or in Ray actors."""


def shard_ids(client_ids: np.ndarray, num_clients: int, num_shards: int = SUM_SHARDS) -> list[np.ndarray]:
    """Split sorted client ids into the contiguous id blocks ``[s·N/S, (s+1)·N/S)``."""
    owners = client_ids * num_shards // num_clients
    return [client_ids[owners == shard] for shard in range(num_shards)]


def add_in_order(sums: list[RoundSums]) -> RoundSums:
    """Σ of block sums, always in block order."""
    total = sums[0]
    for part in sums[1:]:
        total = total + part
    return total
