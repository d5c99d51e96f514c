"""Checking and summing client replies on the server (the Flower path).

A reply is accepted only if it carries exactly what the round asked for, and nothing else:

- one array record ``update`` holding exactly a contribution Δ̄_i (float64, the model's
  dimension d) and a report vector a_i (float64, the policy's length k), all values finite (in
  a counts-first round, the report alone in its first exchange and the contribution alone in
  its second);
- the contribution's L2 norm at most the bound the server sent that client, with no slack: the
  noise is calibrated to that bound, and an honest client's final projection already lands
  2e-9 inside it (:mod:`fairclip.strategies.clipping`);
- a report of L2 norm at most 1 (the sensitivity its noise assumes, whatever a plug-in policy's
  own check accepts) that an honest client of the policy could send
  (:meth:`Policy.report_is_valid`: a {0, 1} bit, a one-hot count in the client's own cohort, a
  unit-or-zero direction);
- the simulation-only diagnostics record only where the run enables it (``simulation-diagnostics``).

Arrays are read without trusting their payload: the declared dtype, shape and serialisation
type, then the ``.npy`` header and the byte length, are checked before a single value is
deserialised, so a reply that declares 2⁵⁰ values or carries an ``.npz`` archive is dropped, not
allocated or crashed on. Anything else is dropped and counted; a bad client never fails the
round and never breaks the sensitivity bound. Dropping a reply is the same as that client not
being sampled, which the add/remove-one-client accounting already covers.

Accepted replies are summed in the fixed id blocks of :data:`fairclip.strategies.aggregation.SUM_SHARDS`,
in the order the executors use, so the Flower path adds the same numbers in the same order.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict

from fairclip.client.protocol import (
    CONTRIBUTION,
    DIAGNOSTIC_FIELDS,
    DIAGNOSTICS,
    EVALUATION,
    REPORTS,
    UPDATE,
    reply_arrays,
)
from fairclip.server.errors import ReplyError
from fairclip.strategies import Policy
from fairclip.strategies import evaluation as client_evaluation
from fairclip.strategies.aggregation import CLIENT_DIAGNOSTICS, CohortDiagnostics, Exchange, RoundSums
from fairclip.strategies.base import Broadcast
from fairclip.strategies.clipping import row_norms


@dataclass(frozen=True)
class Collected:
    """The replies of one exchange, checked: what ``check`` made of each accepted reply (a
    client's sums; its evaluation vector) by client, the clients whose replies
    were dropped (with the reason), and the source node of every reply from a node not sampled."""

    accepted: dict[int, Any]
    dropped: list[tuple[int, str]]
    unexpected: list[int | None]


def collect_replies(
    replies: Iterable[Message],
    client_of: Mapping[int | None, int],
    sampled: Collection[int],
    check: Callable[[RecordDict, int], Any],
) -> Collected:
    """Check the replies of one exchange, for fairclip's ServerApp
    (:class:`fairclip.server.strategy.PolicyStrategy`) and the Flower DP wrapper alike.

    A reply counts for the client its source node is (``client_of``) if that client was
    ``sampled``; any other is unexpected. A sampled client's reply is checked by ``check(content,
    client)`` (:func:`check_reply` with the round's bounds); two replies of one client, a client
    error, or any failure to read or check a reply drop that client's replies, never the round."""
    by_client: dict[int, list[Message]] = {}
    unexpected: list[int | None] = []
    for reply in replies:
        node = source_node(reply)
        client = client_of.get(node)
        if client is None or client not in sampled:
            unexpected.append(node)
            continue
        by_client.setdefault(client, []).append(reply)
    accepted: dict[int, Any] = {}
    dropped: list[tuple[int, str]] = []
    for client, messages in sorted(by_client.items()):
        try:
            if len(messages) != 1:
                raise ReplyError(f"{len(messages)} replies in one round (all dropped)")
            if messages[0].has_error():
                raise ReplyError(f"client error: {messages[0].error.reason}")
            accepted[client] = check(messages[0].content, client)
        except Exception as error:  # any failure to read or check a reply drops it
            reason = str(error) if isinstance(error, ReplyError) else f"{type(error).__name__}: {error}"
            dropped.append((client, reason))
    return Collected(accepted, dropped, unexpected)


def source_node(reply: Message) -> int | None:
    """The node a reply says it comes from; ``None`` where its metadata cannot be read (such a
    reply is unexpected, whatever it holds)."""
    try:
        return int(reply.metadata.src_node_id)
    except Exception:
        return None


NUMPY_STYPE = "numpy.ndarray"
FLOAT64 = np.dtype("<f8")
MAX_HEADER_BYTES = 10_000
"""Longest ``.npy`` header read (numpy's own default limit for untrusted files)."""


def read_float_vector(array: Any, length: int, name: str) -> np.ndarray:
    """The float64 vector of ``length`` values that a Flower ``Array`` holds, or :class:`ReplyError`.

    Checked before anything is deserialised: the declared serialisation type, dtype and shape;
    then the ``.npy`` magic and header (version 1 or 2, C order, little-endian float64, shape
    ``(length,)``) and that exactly 8·``length`` bytes follow it.
    """
    try:
        stype, dtype, shape, data = array.stype, array.dtype, tuple(array.shape), array.data
    except AttributeError:
        raise ReplyError(f"{name} is not an array") from None
    if stype != NUMPY_STYPE or dtype != "float64" or shape != (length,) or not isinstance(data, bytes):
        raise ReplyError(
            f"{name} is declared as {stype} {dtype} {shape}, expected {NUMPY_STYPE} float64 ({length},)"
        )
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            header = np.lib.format.read_array_header_1_0(stream, max_header_size=MAX_HEADER_BYTES)
        elif version == (2, 0):
            header = np.lib.format.read_array_header_2_0(stream, max_header_size=MAX_HEADER_BYTES)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except Exception as error:  # any malformed payload: an .npz archive, garbage, a huge header
        raise ReplyError(f"{name} is not a readable .npy array ({type(error).__name__}: {error})") from None
    header_shape, fortran_order, header_dtype = header
    if tuple(header_shape) != (length,) or fortran_order or np.dtype(header_dtype) != FLOAT64:
        raise ReplyError(f"{name}'s .npy header says {header_dtype} {header_shape}, expected <f8 ({length},)")
    offset = stream.tell()
    if len(data) - offset != FLOAT64.itemsize * length:
        raise ReplyError(f"{name} holds {len(data) - offset} bytes of values, expected {8 * length}")
    vector = np.frombuffer(data, dtype=FLOAT64, count=length, offset=offset).copy()
    if not np.isfinite(vector).all():
        raise ReplyError(f"{name} has non-finite values")
    return vector


def check_reply(
    content: RecordDict,
    *,
    policy: Policy,
    params: Broadcast,
    dim: int,
    cohort: int | None,
    num_cohorts: int,
    diagnostics_allowed: bool = False,
    exchange: Exchange = Exchange.ROUND,
) -> RoundSums:
    """One accepted reply as the sums of a single client, or :class:`ReplyError`.

    ``cohort`` is the client's cohort where the policy needs it (``per-cohort``, ``reweight``)
    and ``None`` otherwise: the server of such a policy never learns it. ``exchange`` says what
    the reply must hold (:func:`fairclip.client.protocol.reply_arrays`); the part it does not
    carry is zero in the sums.
    """
    _check_records(content, diagnostics_allowed and exchange is not Exchange.COUNTS)
    record = content.array_records[UPDATE]
    expected = reply_arrays(exchange)
    if set(record.keys()) != set(expected):
        raise ReplyError(f"update record holds {sorted(record.keys())}, expected {list(expected)}")
    report_size = policy.report_size(dim)
    contribution = np.zeros(dim)
    reports = np.zeros(report_size)
    if CONTRIBUTION in expected:
        contribution = read_float_vector(record[CONTRIBUTION], dim, "contribution")
        bound = float(policy.contribution_bounds(params, np.array([0 if cohort is None else cohort]))[0])
        norm = float(row_norms(contribution[None, :])[0])
        if not norm <= bound:
            raise ReplyError(f"contribution norm {norm!r} exceeds the bound {bound!r} it was sent")
    if REPORTS in expected:
        reports = read_float_vector(record[REPORTS], report_size, "reports")
        if report_size and not float(row_norms(reports[None, :])[0]) <= 1.0:  # the noise's sensitivity
            raise ReplyError("report vector has norm above 1")
        if not policy.report_is_valid(reports, cohort):
            raise ReplyError(f"report vector is not one an honest {policy.name!r} client sends")
    diagnostics = None
    if DIAGNOSTICS in content.metric_records:
        diagnostics = read_diagnostics(content, num_cohorts, cohort)
    if diagnostics is None:
        diagnostics = CohortDiagnostics.zeros(num_cohorts)
        for diagnostic in CLIENT_DIAGNOSTICS:
            if not diagnostic.known_without:
                getattr(diagnostics, diagnostic.name)[:] = np.nan
        diagnostics.norms = ()  # not known: no cohort's median either
        if cohort is not None:
            diagnostics.sampled[:] = 0.0
            diagnostics.sampled[cohort] = 1.0
    return RoundSums(contribution, reports, 1, diagnostics)


def check_evaluation_reply(
    content: RecordDict, *, num_cohorts: int, max_examples: int, loss_bound: float
) -> np.ndarray:
    """A client's evaluation vector (``[evaluation] clients``), or :class:`ReplyError`: exactly the
    ``evaluation`` array record holding one float64 vector of 3K values, of the form an honest
    client sends (:func:`fairclip.strategies.evaluation.problem`: one cohort's slot, counts
    within m, the loss sum within examples·L), so its norm is at most Δ_E."""
    try:
        arrays = set(content.array_records.keys())
        others = set(content.metric_records.keys()) | set(content.config_records.keys())
    except AttributeError:
        raise ReplyError("reply content is not a record dictionary") from None
    if arrays != {EVALUATION} or others:
        raise ReplyError(f"evaluation reply holds {sorted(arrays | others)}, expected [{EVALUATION!r}]")
    record = content.array_records[EVALUATION]
    if set(record.keys()) != {EVALUATION}:
        raise ReplyError(f"evaluation record holds {sorted(record.keys())}, expected [{EVALUATION!r}]")
    vector = read_float_vector(record[EVALUATION], 3 * num_cohorts, "evaluation vector")
    problem = client_evaluation.problem(vector, num_cohorts, max_examples, loss_bound)
    if problem is not None:
        raise ReplyError(problem)
    return vector


def _check_records(content: RecordDict, diagnostics_allowed: bool) -> None:
    """Exactly the ``update`` array record, plus the diagnostics record where the run allows it."""
    try:
        arrays = set(content.array_records.keys())
        metrics = set(content.metric_records.keys())
        configs = set(content.config_records.keys())
    except AttributeError:
        raise ReplyError("reply content is not a record dictionary") from None
    if arrays != {UPDATE}:
        raise ReplyError(f"reply holds array records {sorted(arrays)}, expected [{UPDATE!r}]")
    if DIAGNOSTICS in metrics and not diagnostics_allowed:
        raise ReplyError("reply carries simulation diagnostics, which this run does not enable")
    extra = sorted((metrics - {DIAGNOSTICS}) | configs)
    if extra:
        raise ReplyError(f"reply carries records beyond the contribution and reports: {extra}")


def read_diagnostics(content: RecordDict, num_cohorts: int, cohort: int | None) -> CohortDiagnostics:
    """The simulation-only diagnostics of one client's reply (a one-hot ``sampled``, bits at most
    ``sampled``, norms >= 0), or :class:`ReplyError`."""
    record = content.metric_records[DIAGNOSTICS]
    if set(record.keys()) != set(DIAGNOSTIC_FIELDS):
        raise ReplyError(
            f"diagnostics record holds {sorted(record.keys())}, expected {list(DIAGNOSTIC_FIELDS)}"
        )
    values = {}
    for name in DIAGNOSTIC_FIELDS:
        raw = record[name]
        if not isinstance(raw, list) or not all(isinstance(v, float) for v in raw):
            raise ReplyError(f"diagnostics field {name!r} is not a list of floats")
        array = np.asarray(raw, dtype=np.float64)
        if array.shape != (num_cohorts,) or not np.isfinite(array).all() or (array < 0).any():
            raise ReplyError(f"diagnostics field {name!r} is malformed")
        values[name] = array
    sampled = values["sampled"]
    own = int(np.argmax(sampled))
    if not np.array_equal(sampled, np.eye(num_cohorts)[own]) or (cohort is not None and own != cohort):
        raise ReplyError("diagnostics field 'sampled' is not the client's own one-hot cohort")
    for name in (diagnostic.name for diagnostic in CLIENT_DIAGNOSTICS if diagnostic.kind == "bit"):
        if not np.isin(values[name], (0.0, 1.0)).all() or (values[name] > sampled).any():
            raise ReplyError(f"diagnostics field {name!r} is not a bit of the client's cohort")
    norms = tuple(values["norm_before"][k : k + 1] if k == own else np.empty(0) for k in range(num_cohorts))
    return CohortDiagnostics(**{name: values[name] for name in DIAGNOSTIC_FIELDS}, norms=norms)
