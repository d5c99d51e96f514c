"""How the clients' contributions are summed, the same way on every executor and the Flower server.

Everything a round adds up -- contributions, report vectors, and the simulation-only
diagnostics -- travels as :class:`RoundSums`. Clients are summed in :data:`SUM_SHARDS` fixed
blocks of ids, always added in block order, so that the floating-point sum (and with it the
whole run) is identical whether the blocks are summed in this process, in Ray actors or from
Flower replies. :func:`group_blocks` fixes which blocks are trained in one call and
:func:`balance` shares those groups out to workers; neither changes the result.

This module is pure numpy and sits with the policies because the client side (which produces
``RoundSums``), the server side (which sums replies) and every executor share it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import numpy as np

from fairclip.strategies.clipping import inner, vector_norm


@dataclass(frozen=True)
class Diagnostic:
    """One per-client diagnostic: a number each sampled client computes (simulation only: it is
    not DP-protected, so it never reaches a public output), summed per cohort over the round's
    clients like every other sum, and shown per round in the server-internal record.

    ``name``: the :class:`CohortDiagnostics` field (K values, one per cohort) and the key of a
    reply's diagnostics record. ``per_client(reports)``: the value of each client, one per row,
    from the policy's client reports (:class:`fairclip.strategies.base.ClientReports` or
    ``ScaledReports``), which a client sums into its cohort's entry (``None``: the client counts
    itself, ``sampled``). ``kind``: ``count`` (the client's one-hot
    cohort), ``bit`` (0 or 1, at most ``sampled``) or ``norm`` (>= 0): what the server checks in a
    reply. ``column``: the row column ``<cohort>/<column>``: the count itself, or the mean over
    the cohort's sampled clients (``None``: no per-cohort column). ``known_without``: a reply
    without diagnostics still fixes the value (0: a reply that arrived was finite); else the
    server records it as unknown (NaN).
    """

    name: str
    per_client: Callable[[Any], np.ndarray] | None
    kind: str
    column: str | None
    known_without: bool = False


CLIENT_DIAGNOSTICS = (
    Diagnostic("sampled", None, "count", "sampled"),
    Diagnostic("exceeded", lambda reports: reports.exceeded, "bit", "clipped_fraction"),
    Diagnostic("nonfinite", lambda reports: reports.nonfinite, "bit", None, known_without=True),
    Diagnostic("norm_before", lambda reports: reports.norms, "norm", "norm_before"),
    Diagnostic("norm_after", lambda reports: reports.contribution_norms, "norm", "norm_after"),
)
"""The per-client diagnostics, in their order in a reply and in a round's row. The client side
(:func:`fairclip.client.contributions.contribute_blocks`), the sums (:class:`CohortDiagnostics`),
a Flower reply's record (:mod:`fairclip.client.protocol`, :mod:`fairclip.server.replies`) and
the row writer (:mod:`fairclip.server.run`) all read this list: a new diagnostic is an entry
here (with its computation) and its field in :class:`CohortDiagnostics`, and its column's row
on the documentation's output page (``docs/reference/outputs.md``, which a test checks)."""


@dataclass
class CohortDiagnostics:
    """Simulation-only sums per cohort (arrays of length K), and each cohort's update norms
    before clipping (``norms[k]``, one value per client; ``()`` where they are not known) for
    the per-cohort median, which no sum gives.

    Where a run asks for them (``training.cohort_directions``), also each cohort's aggregate
    update before and after the client side of the policy (K × d: Σ_{i in k} Δ_i and
    Σ_{i in k} c_i, the contribution before noise), from which :meth:`direction_cosine` and
    :meth:`magnitude_ratio` come (seed 003, section 4: clipping's direction and magnitude errors).
    They are formed once per call of the client side and carried by its last block (None on
    the others, which adds nothing), not per summation block."""

    sampled: np.ndarray
    exceeded: np.ndarray
    nonfinite: np.ndarray
    norm_before: np.ndarray
    norm_after: np.ndarray
    norms: tuple[np.ndarray, ...] = ()
    unclipped_sums: np.ndarray | None = None
    clipped_sums: np.ndarray | None = None
    unclipped_total: np.ndarray | None = None
    """Σ Δ_i over all the clients' finite raw updates (d), where a run asks for it
    (``training.clipping_error``): the unclipped counterpart of the contribution sum."""

    @classmethod
    def zeros(cls, num_cohorts: int) -> CohortDiagnostics:
        return cls(
            **{d.name: np.zeros(num_cohorts) for d in CLIENT_DIAGNOSTICS},
            norms=tuple(np.empty(0) for _ in range(num_cohorts)),
        )

    def __add__(self, other: CohortDiagnostics) -> CohortDiagnostics:
        known = bool(self.norms) and bool(other.norms)
        return CohortDiagnostics(
            **{d.name: getattr(self, d.name) + getattr(other, d.name) for d in CLIENT_DIAGNOSTICS},
            norms=tuple(map(np.concatenate, zip(self.norms, other.norms, strict=True))) if known else (),
            unclipped_sums=_add_carried(self.unclipped_sums, other.unclipped_sums),
            clipped_sums=_add_carried(self.clipped_sums, other.clipped_sums),
            unclipped_total=_add_or_none(self.unclipped_total, other.unclipped_total),
        )

    def direction_cosine(self, cohort: int) -> float:
        """cos(Σ c_i, Σ Δ_i) over the cohort's clients: 1 where clipping kept the direction of
        the cohort's aggregate update; NaN where not tracked, none sampled, or a sum is zero."""
        if self.unclipped_sums is None or self.clipped_sums is None:
            return float("nan")
        before, after = self.unclipped_sums[cohort], self.clipped_sums[cohort]
        norms = vector_norm(before) * vector_norm(after)
        return inner(before, after) / norms if norms > 0 else float("nan")

    def magnitude_ratio(self, cohort: int) -> float:
        """||Σ c_i|| / ||Σ Δ_i|| over the cohort's clients: how much of the cohort's aggregate
        update's length clipping kept; NaN where not tracked or the unclipped sum is zero."""
        if self.unclipped_sums is None or self.clipped_sums is None:
            return float("nan")
        before = vector_norm(self.unclipped_sums[cohort])
        return vector_norm(self.clipped_sums[cohort]) / before if before > 0 else float("nan")

    def median_norm(self, cohort: int) -> float:
        """Median update norm (before clipping) of cohort ``cohort``'s clients; NaN where none
        were sampled or the norms are not known."""
        if not self.norms or self.norms[cohort].size == 0:
            return float("nan")
        return float(np.median(self.norms[cohort]))


def cohort_sums(rows: np.ndarray, groups: np.ndarray, num_cohorts: int) -> np.ndarray:
    """K × d: each cohort's sum of its ``rows`` (n × d), where ``groups[i]`` is row i's cohort,
    or -1 for a row in none (one whose update is not finite). Each row is read once, whatever K
    (:attr:`CohortDiagnostics.unclipped_sums`, the last epoch's cohort sums
    :meth:`fairclip.scenarios.tasks.classification.ClassificationTask.cohort_update_sums`; the
    norm-only path's counterpart is :meth:`fairclip.scenarios.tasks.ghost.OneStepGradients.grouped_sums`)."""
    return np.stack([rows[groups == k].sum(axis=0) for k in range(num_cohorts)])


def _add_or_none(first: np.ndarray | None, second: np.ndarray | None) -> np.ndarray | None:
    """The sum of two tracked arrays; None unless both are tracked."""
    return None if first is None or second is None else first + second


def _add_carried(first: np.ndarray | None, second: np.ndarray | None) -> np.ndarray | None:
    """The sum of the cohort sums two parts carry, where None is a part that carries none: a
    call's cohort sums ride on its last block only
    (:func:`fairclip.client.contributions.contribute_blocks`); None where neither carries any."""
    if first is None or second is None:
        return second if first is None else first
    return first + second


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

    def __reduce__(self) -> tuple[Callable[..., RoundSums], tuple]:
        """Pickle (as Ray sends a worker's block sums to the driver) with every all-zero vector
        as its shape alone: a block without sampled clients, and the half of a counts-first
        round's exchange that it does not carry (:func:`sent_in`), are whole vectors of zeros.
        They unpickle as the same zeros, bit for bit."""
        return _unpickle_round_sums, (
            _packed(self.contribution_sum),
            _packed(self.report_sum),
            self.num_reports,
            self.diagnostics,
        )


def _packed(array: np.ndarray) -> np.ndarray | tuple[tuple[int, ...], str]:
    """``array``, or ``(shape, dtype)`` where it is floating point and every entry is +0.0 (a
    -0.0 keeps the array)."""
    array = np.asarray(array)
    if array.dtype.kind == "f" and array.size and not array.any() and not np.signbit(array).any():
        return array.shape, array.dtype.str
    return array


def _unpacked(packed: np.ndarray | tuple[tuple[int, ...], str]) -> np.ndarray:
    if isinstance(packed, tuple):
        shape, dtype = packed
        return np.zeros(shape, dtype=np.dtype(dtype))
    return packed


def _unpickle_round_sums(contribution_sum, report_sum, num_reports: int, diagnostics) -> RoundSums:
    return RoundSums(_unpacked(contribution_sum), _unpacked(report_sum), num_reports, diagnostics)


class Exchange(StrEnum):
    """Which part of a round one exchange with the clients carries."""

    ROUND = "round"
    """The whole round: contributions and reports together (every policy but a counts-first one)."""
    COUNTS = "counts"
    """The first exchange of a counts-first round (:attr:`Policy.counts_first`): reports only."""
    UPDATES = "updates"
    """Its second exchange: contributions only."""


def sent_in(sums: RoundSums, exchange: Exchange) -> RoundSums:
    """What ``sums`` (one block's) releases in ``exchange``, so that nothing a client computed
    for the other exchange reaches the server: the updates exchange's report sum is zero, and
    the counts exchange carries no contribution sum at all (an empty vector, :data:`NOT_SENT`):
    the executors then neither form nor add 64 model-sized vectors of zeros per round (on an H200,
    ``xu-cnn``, they took 18.6 s of a same-round ``per-cohort`` run's 35.5 s under cProfile).
    :func:`round_total` gives the round's total the model's length again."""
    if exchange is Exchange.COUNTS:
        return replace(sums, contribution_sum=NOT_SENT)
    if exchange is Exchange.UPDATES:
        return replace(sums, report_sum=np.zeros_like(sums.report_sum))
    return sums


NOT_SENT = np.zeros(0)
"""The contribution sum of a block in the counts exchange, which carries none (:func:`sent_in`)."""
NOT_SENT.flags.writeable = False


def round_total(total: RoundSums, exchange: Exchange, dimension: int) -> RoundSums:
    """The block-order total of :func:`sent_in` sums as the server takes it: in the counts
    exchange, whose blocks carry no contribution, its contribution sum is ``dimension`` zeros
    (what adding the blocks' zero vectors gave, bit for bit)."""
    if exchange is Exchange.COUNTS:
        return replace(total, contribution_sum=np.zeros(dimension))
    return total


SUM_SHARDS = 64
"""Clients are summed in this many fixed blocks of ids, in block order, on every executor, so that
the floating-point sum -- and with it the whole run -- is the same whether the blocks are
computed here, in threads or in any number of Ray actors (at most this many: a block is never
split). 64 blocks let a run use up to 64 actors; the sums of all blocks are held at once, so a
round's aggregation holds 64 model-sized vectors (W1's CNN: 54 MB)."""


def shard_bounds(num_clients: int, num_shards: int = SUM_SHARDS) -> list[int]:
    """The first id of each block and the end of the last: block s holds ⌈s·N/S⌉ ≤ i < ⌈(s+1)·N/S⌉."""
    return [-(-shard * num_clients // num_shards) for shard in range(num_shards + 1)]


def shard_ids(client_ids: np.ndarray, num_clients: int, num_shards: int = SUM_SHARDS) -> list[np.ndarray]:
    """Split sorted client ids into the contiguous id blocks: block s holds the ids i with
    ⌊i·S/N⌋ = s, that is ⌈s·N/S⌉ ≤ i < ⌈(s+1)·N/S⌉ (cut by binary search, so the cost does not
    grow with S·m)."""
    client_ids = np.asarray(client_ids)
    if client_ids.size > 1 and np.any(client_ids[1:] < client_ids[:-1]):
        raise ValueError("shard_ids needs sorted client ids")
    cuts = np.searchsorted(client_ids, shard_bounds(num_clients, num_shards), side="left")
    return [client_ids[cuts[shard] : cuts[shard + 1]] for shard in range(num_shards)]


def add_in_order(sums: list[RoundSums]) -> RoundSums:
    """Σ of block sums, always in block order. The model-sized contribution vectors are added
    into one running total, in place: the same IEEE additions in the same order as
    ``sums[0] + sums[1] + ...``, so the same bits, without a new vector per block (63 of them a
    round of a 64-block sum: 6 % of an ``xu-cnn`` round on 2 CPU cores)."""
    contribution = np.array(sums[0].contribution_sum)  # a copy: no block's own vector changes
    rest = replace(sums[0], contribution_sum=NOT_SENT)
    for part in sums[1:]:
        if np.result_type(contribution, part.contribution_sum) == contribution.dtype:
            contribution += part.contribution_sum
        else:  # a wider type (float32 blocks, then a float64 one): promoted, as ``+`` would
            contribution = contribution + part.contribution_sum
        rest = rest + replace(part, contribution_sum=NOT_SENT)
    return replace(rest, contribution_sum=contribution)


GROUP_BYTES = 256 * 2**20
"""Bound on the float64 updates one ``Task.local_updates`` call of :func:`group_blocks` returns
(where the call forms them: a group clipped from per-example norms holds no update rows)."""


def group_blocks(blocks: list[np.ndarray], rows_per_call: int, dimension: int) -> list[dict[int, np.ndarray]]:
    """Merge consecutive blocks of sampled clients into groups trained in one call.

    A group takes the next block while it stays within ``rows_per_call`` clients (the task's
    best batch, :attr:`Task.rows_per_call`) and :data:`GROUP_BYTES` of updates of ``dimension``
    float64 entries; a block is never split. ``dimension`` 0: the call forms no update rows (the
    one-step path clips from per-example norms), and the task's batch alone bounds the group.
    The one-step path so computes per-sample gradients in vectorised batches of about
    ``rows_per_call`` examples even when the sampled batch falls into many small blocks.
    Kernels may round differently for other batch sizes, so the groups depend only on the
    sampled clients, the task and the policy -- never on the executor or its number of workers --
    and every executor trains the same groups: the run stays identical on all of them.
    """
    limit = max(1, min(rows_per_call, GROUP_BYTES // (8 * dimension)) if dimension else rows_per_call)
    groups: list[dict[int, np.ndarray]] = []
    rows = 0
    for index, ids in enumerate(blocks):
        if not groups or rows + len(ids) > limit:
            groups.append({})
            rows = 0
        groups[-1][index] = ids
        rows += len(ids)
    return groups


def balance(
    groups: list[dict[int, np.ndarray]],
    workers: int,
    candidates: Callable[[dict[int, np.ndarray]], Sequence[int]] | None = None,
) -> list[list[dict[int, np.ndarray]]]:
    """Share groups out to ``workers`` by longest-processing-time first: the largest group (in
    clients) goes to the least-loaded worker among its ``candidates`` (default: every worker;
    the first of them on ties). Dealing groups round-robin instead cost W1 (8 blocks then, of
    Poisson size, on 2 Ray actors) 7.5 % of its round time, waiting for the busier actor; this
    left about 1.6 % (simulated over 2,000 rounds)."""
    shares: list[list[dict[int, np.ndarray]]] = [[] for _ in range(workers)]
    loads = [0] * workers
    everyone = range(workers)
    for group in sorted(groups, key=lambda g: -sum(len(ids) for ids in g.values())):
        allowed = everyone if candidates is None else candidates(group)
        lightest = min(allowed, key=loads.__getitem__)
        shares[lightest].append(group)
        loads[lightest] += sum(len(ids) for ids in group.values())
    return shares


def sum_replies(
    accepted: dict[int, RoundSums], num_clients: int, dim: int, report_size: int, num_cohorts: int
) -> RoundSums:
    """Σ of the accepted clients' sums, block by block in id order (as every executor adds)."""
    empty = RoundSums(np.zeros(dim), np.zeros(report_size), 0, CohortDiagnostics.zeros(num_cohorts))
    ids = np.array(sorted(accepted), dtype=np.int64)
    blocks = []
    for block in shard_ids(ids, num_clients):
        total = empty
        for client in block:
            total = accepted[int(client)] if total is empty else total + accepted[int(client)]
        blocks.append(total)
    return add_in_order(blocks)
