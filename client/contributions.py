"""The client side of a round for a group of clients, summed the way the server receives it.

:func:`contribute` applies the policy's client transform to the raw updates of some clients
(one client in a Flower ``ClientApp``, a shard in a Ray actor, all sampled clients in the
in-process executor) and returns the sums that go to the server, plus per-cohort diagnostics
that only a simulation may record (true counts and update norms; a real client never reports
its raw norm).
"""

from __future__ import annotations

import numpy as np
import torch

from fairclip.scenarios.tasks.ghost import OneStepGradients
from fairclip.strategies import Policy
from fairclip.strategies.aggregation import (
    CLIENT_DIAGNOSTICS,
    NOT_SENT,
    CohortDiagnostics,
    Exchange,
    RoundSums,
    cohort_sums,
)
from fairclip.strategies.base import Broadcast, ClientReports, ScaledReports


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
    directions: bool = False,
    unclipped_total: bool = False,
) -> list[RoundSums]:
    """:func:`contribute` for consecutive blocks of rows (``sizes[j]`` rows each) at once: the
    policy's client side runs once over all rows (it acts on each client's row alone), then each
    block is summed on its own rows -- the same sums as one call per block, bit for bit, without
    the per-call cost that 64 small blocks a round would pay. ``directions``: also each
    cohort's sums of its raw updates and of its contributions over all the rows (simulation
    diagnostics, carried by the last block: :func:`_call_cohort_sums`); ``unclipped_total``:
    also each block's sum of the raw updates that contribute (simulation only)."""
    updates = np.atleast_2d(np.asarray(updates, dtype=np.float64))
    cohorts = np.asarray(cohorts, dtype=np.int64)
    reports = policy.client_side(updates, cohorts, params)
    blocks = _block_rows(sizes, updates.shape[0])
    call_sums = None
    if directions:
        kept = _contributing(reports, slice(0, updates.shape[0]))
        groups = np.where(kept > 0, cohorts, -1)  # a dropped row is in no cohort's sums
        call_sums = (
            cohort_sums(updates, groups, num_cohorts),
            cohort_sums(reports.contributions, groups, num_cohorts),
        )
    sums = []
    for j, (rows, size) in enumerate(blocks):
        total = None
        if unclipped_total:
            kept = _contributing(reports, rows)
            total = np.where(kept[:, None] > 0, updates[rows], 0.0).sum(axis=0)
        carried = _call_cohort_sums(call_sums, j, len(blocks))
        sums.append(
            RoundSums(
                contribution_sum=reports.contributions[rows].sum(axis=0),
                report_sum=reports.reports[rows].sum(axis=0),
                num_reports=size,
                diagnostics=_diagnostics(reports, cohorts[rows], rows, num_cohorts, carried, total),
            )
        )
    return sums


def _call_cohort_sums(
    call_sums: tuple[np.ndarray, np.ndarray] | None, block: int, blocks: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The cohort sums (``training.cohort_directions``) that block ``block`` of a call's
    ``blocks`` carries: the whole call's, on its last block; none on the others. Formed once a
    call rather than once a block (each row read once, not 2 K times a block), they are
    diagnostics, never released. A call's blocks are the same on every executor and number of
    workers (:func:`fairclip.strategies.aggregation.group_blocks`) and the server adds the blocks
    in their order (:meth:`CohortDiagnostics.__add__` adds the calls'), so they stay the same
    on all of them, bit for bit, as the released sums do."""
    return call_sums if block == blocks - 1 else None


def _contributing(reports: ClientReports | ScaledReports, rows: slice) -> np.ndarray:
    """1 for each of the block's rows that contributes (its update and its norm are finite),
    else 0: the rows the unclipped sums take, on both the materialised and the one-step path."""
    return 1.0 - np.asarray(reports.nonfinite, dtype=np.float64)[rows]


def contribute_scaled_blocks(
    policy: Policy,
    params: Broadcast,
    gradients: OneStepGradients,
    cohorts: np.ndarray,
    num_cohorts: int,
    sizes: list[int],
    exchange: Exchange = Exchange.ROUND,
    directions: bool = False,
    unclipped_total: bool = False,
    on_device: bool = False,
) -> list[RoundSums]:
    """:func:`contribute_blocks` for a row-scaling policy (:attr:`Policy.row_scaling`) from the
    norms and weighted sums of updates that are never materialised (:mod:`fairclip.scenarios.tasks.ghost`):
    the policy decides each client's factors from its norm, and each block's sums are the
    factor-weighted sums of its rows -- what :func:`contribute_blocks` sums, to rounding.

    Only what ``exchange`` releases is summed (:func:`fairclip.strategies.aggregation.sent_in`):
    the first exchange of a counts-first round forms no contribution sum (an empty vector,
    ``NOT_SENT``), the second no report sum (zeros). ``directions`` (simulation diagnostics, in
    the exchange that carries the contributions): each cohort's sums of its unscaled and scaled
    rows over the whole call, two weighted sums of each cohort's rows
    (:meth:`OneStepGradients.grouped_sums`, :func:`_call_cohort_sums`);
    ``unclipped_total`` (there too): each block's sum of the unscaled rows that contribute, one
    more weighted sum per block. ``on_device``: each block's ``contribution_sum``,
    and its ``report_sum`` where that is a weighted sum of the updates (a direction report, as
    ``online``'s), stays where the gradients are (a GPU, or the CPU), as a float64 tensor with
    the same numbers, for the caller to add up there
    (:func:`fairclip.sims.executors.local.add_in_order_on_device`); everything else comes to the
    host as always."""
    cohorts = np.asarray(cohorts, dtype=np.int64)
    scaled = policy.scaled_client_side(gradients.norms, cohorts, params)
    contributions = exchange is not Exchange.COUNTS
    # reports that are r_i-weighted updates (``online``'s directions; then ``scaled.reports`` is None)
    direction_reports = scaled.report_scales is not None and exchange is not Exchange.UPDATES
    report_size = policy.report_size(gradients.dim)
    tracked = directions and contributions
    totalled = unclipped_total and contributions
    blocks = _block_rows(sizes, cohorts.shape[0])
    block_weights = []
    for rows, _ in blocks:
        weights = [scaled.contribution_scales[rows]] if contributions else []
        if direction_reports:
            weights.append(scaled.report_scales[rows])
        if totalled:
            weights.append(_contributing(scaled, rows))
        block_weights.append(np.stack(weights) if weights else np.empty((0, rows.stop - rows.start)))
    block_rows = [rows for rows, _ in blocks]
    block_sums = gradients.block_weighted_sums(block_rows, block_weights, on_device=on_device)
    call_sums = None
    if tracked and blocks:
        kept = _contributing(scaled, slice(0, cohorts.shape[0]))
        groups = np.where(kept > 0, cohorts, -1)  # a dropped row is in no cohort's sums
        unscaled, scaled_sums = gradients.grouped_sums(
            groups, np.stack([kept, kept * scaled.contribution_scales]), num_cohorts
        )
        call_sums = (unscaled, scaled_sums)
    sums = []
    for j, ((rows, size), weighted_rows) in enumerate(zip(blocks, block_sums, strict=True)):
        if isinstance(weighted_rows, torch.Tensor):  # on the device: the model-sized sums stay
            stays = int(contributions) + int(direction_reports)
            weighted = [*weighted_rows[:stays], *weighted_rows[stays:].cpu().numpy()]
        else:
            weighted = list(weighted_rows)
        total = weighted.pop() if totalled else None
        carried = _call_cohort_sums(call_sums, j, len(blocks))
        contribution_sum = weighted.pop(0) if contributions else NOT_SENT
        if exchange is Exchange.UPDATES:
            report_sum = np.zeros(report_size)
        else:
            report_sum = weighted.pop(0) if direction_reports else scaled.reports[rows].sum(axis=0)
        sums.append(
            RoundSums(
                contribution_sum=contribution_sum,
                report_sum=report_sum,
                num_reports=size,
                diagnostics=_diagnostics(scaled, cohorts[rows], rows, num_cohorts, carried, total),
            )
        )
    return sums


def _block_rows(sizes: list[int], rows: int) -> list[tuple[slice, int]]:
    """The rows of consecutive blocks of ``sizes[j]`` rows, which must cover all ``rows``."""
    if sum(sizes) != rows:
        raise ValueError(f"blocks of {sum(sizes)} rows for {rows} updates")
    ends = np.cumsum([0, *sizes])
    return [(slice(int(ends[j]), int(ends[j + 1])), size) for j, size in enumerate(sizes)]


def _diagnostics(
    reports: ClientReports | ScaledReports,
    block_cohorts: np.ndarray,
    rows: slice,
    num_cohorts: int,
    carried: tuple[np.ndarray, np.ndarray] | None = None,
    unclipped_total: np.ndarray | None = None,
) -> CohortDiagnostics:
    """The simulation-only per-cohort diagnostics of one block's rows (with each cohort's
    unclipped and clipped sums, and the unclipped total, where tracked)."""

    def per_cohort(values: np.ndarray) -> np.ndarray:
        return np.bincount(
            block_cohorts, weights=np.asarray(values[rows], dtype=np.float64), minlength=num_cohorts
        )

    block_norms = np.asarray(reports.norms, dtype=np.float64)[rows]
    sampled = np.bincount(block_cohorts, minlength=num_cohorts).astype(np.float64)
    return CohortDiagnostics(
        **{
            d.name: sampled if d.per_client is None else per_cohort(d.per_client(reports))
            for d in CLIENT_DIAGNOSTICS
        },
        norms=tuple(block_norms[block_cohorts == k] for k in range(num_cohorts)),
        unclipped_sums=None if carried is None else carried[0],
        clipped_sums=None if carried is None else carried[1],
        unclipped_total=unclipped_total,
    )
