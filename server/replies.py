"""Checking and summing client replies on the server (the Flower path).

A reply is accepted only if it carries exactly what the round asked for: a float64 contribution
of the model's dimension d, a float64 report vector of the policy's length k, all values
finite, the contribution's norm within the bound the server sent that client (so the noise,
calibrated to the round's sensitivity, still covers it) and the report vector's norm at most 1.
Anything else is dropped and counted; a bad client never fails the round and never breaks the
sensitivity bound. Dropping a client's reply is the same as that client not being sampled,
which the add/remove-one-client accounting already covers.

Accepted replies are summed in the fixed id blocks of :data:`fairclip.client.contributions.SUM_SHARDS`,
in the order the engines use, so the Flower path adds the same numbers in the same order.
"""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict

from fairclip.client.contributions import CohortDiagnostics, RoundSums, add_in_order, shard_ids
from fairclip.client.protocol import CONTRIBUTION, REPORTS, UPDATE, read_diagnostics

NORM_SLACK = 1e-9
"""Relative tolerance on norm checks, for the rounding of a norm computed on another machine."""


class ReplyError(ValueError):
    """A client reply that the server must drop."""


def check_reply(
    content: RecordDict, *, dim: int, report_size: int, bound: float, cohort: int, num_cohorts: int
) -> RoundSums:
    """One accepted reply as the sums of a single client, or :class:`ReplyError`."""
    try:
        record = content.array_records[UPDATE]
        contribution = record[CONTRIBUTION].numpy()
        reports = record[REPORTS].numpy()
    except (KeyError, TypeError, ValueError) as error:
        raise ReplyError(f"missing or unreadable update arrays ({error})") from None
    _check_vector("contribution", contribution, dim)
    _check_vector("reports", reports, report_size)
    norm = float(np.linalg.norm(contribution))
    if norm > bound * (1 + NORM_SLACK):
        raise ReplyError(f"contribution norm {norm:.6g} exceeds the bound {bound:.6g} it was sent")
    if report_size and float(np.linalg.norm(reports)) > 1 + NORM_SLACK:
        raise ReplyError("report vector has norm above 1")
    try:
        diagnostics = read_diagnostics(content, num_cohorts)
    except ValueError as error:
        raise ReplyError(str(error)) from None
    if diagnostics is None:
        diagnostics = CohortDiagnostics.zeros(num_cohorts)
        diagnostics.sampled[cohort] = 1.0
        diagnostics.exceeded[:] = np.nan
        diagnostics.norm_before[:] = np.nan
        diagnostics.norm_after[:] = np.nan
    return RoundSums(contribution, reports, 1, diagnostics)


def _check_vector(name: str, array: np.ndarray, length: int) -> None:
    if array.dtype != np.float64 or array.shape != (length,):
        raise ReplyError(
            f"{name} has dtype {array.dtype} and shape {array.shape}, expected float64 ({length},)"
        )
    if not np.isfinite(array).all():
        raise ReplyError(f"{name} has non-finite values")


def sum_replies(
    accepted: dict[int, RoundSums], num_clients: int, dim: int, report_size: int, num_cohorts: int
) -> RoundSums:
    """Σ of the accepted clients' sums, block by block in id order (as every engine adds)."""
    empty = RoundSums(np.zeros(dim), np.zeros(report_size), 0, CohortDiagnostics.zeros(num_cohorts))
    ids = np.array(sorted(accepted), dtype=np.int64)
    blocks = []
    for block in shard_ids(ids, num_clients):
        total = empty
        for client in block:
            total = accepted[int(client)] if total is empty else total + accepted[int(client)]
        blocks.append(total)
    return add_in_order(blocks)
