"""The messages between fairclip's ``ServerApp`` and ``ClientApp`` (Flower 1.41 records).

Three exchanges:

- **identify** (``query``): the server asks every node which client it is; the reply holds the
  node's ``partition-id`` (its client id) and ``num-partitions`` (N), and its cohort index only
  where the run's policy needs it (``per-cohort``, ``reweight``; docs/design.md, section 3). For every
  other policy the cohort -- for ``adult`` and ``dutch`` the protected attribute -- never leaves
  the node.
- **train** (``train``): the server sends θ_t (``model``), the policy's public parameters of the
  round (``policy``, for example C_t) and the round number; the client replies with its clipped
  contribution Δ̄_i and its report vector (the policy's bits) -- nothing else, unless the run
  enables ``simulation-diagnostics`` and the node trains on a simulated partition: then it adds
  the simulation-only diagnostics of :class:`fairclip.client.contributions.CohortDiagnostics`
  (labelled as such), which the server refuses in any other run.

  A policy that releases its counts first (``per-cohort`` with ``same_round``) asks the same
  clients twice a round: ``exchange = "counts"`` (the reply holds the report vector alone), then
  ``exchange = "updates"`` with the bounds those counts set (the contribution alone).
- **evaluate** (``evaluate``, ``[evaluation] clients``): after a round, the server sends the
  model it released and the round number to a fresh Poisson sample of clients; each replies with
  its evaluation vector alone (``evaluation``: 3K float64 values, its correct predictions,
  examples and clipped loss sum in its own cohort's slot, :mod:`fairclip.strategies.evaluation`).

Everything is flattened float64 vectors, exactly what the executors pass to the policy code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fairclip.strategies import POLICIES
from fairclip.strategies.aggregation import CLIENT_DIAGNOSTICS, Exchange, RoundSums

IDENTIFY = "identity"
MODEL = "model"
POLICY = "policy"
ROUND = "round"
EXCHANGE = "exchange"
UPDATE = "update"
CONTRIBUTION = "contribution"
REPORTS = "reports"
DIAGNOSTICS = "simulation-diagnostics"
EVALUATION = "evaluation"
"""The record (and its one array) of a client's evaluation vector."""
DIAGNOSTIC_FIELDS = tuple(diagnostic.name for diagnostic in CLIENT_DIAGNOSTICS)
"""The diagnostics record's fields (:data:`fairclip.strategies.aggregation.CLIENT_DIAGNOSTICS`)."""


PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
COHORT = "cohort"


def identity_content(partition_id: int, num_partitions: int, cohort: int | None) -> RecordDict:
    """A node's answer to *identify*: its client id and N, and its cohort index only where it
    is given (``None``: the policy does not need it, and it is not sent)."""
    identity = {PARTITION_ID: int(partition_id), NUM_PARTITIONS: int(num_partitions)}
    if cohort is not None:
        identity[COHORT] = int(cohort)
    return RecordDict({IDENTIFY: ConfigRecord(identity)})


def train_content(
    model: np.ndarray, params: dict[str, Any], round_number: int, exchange: Exchange = Exchange.ROUND
) -> RecordDict:
    """The instruction of one round: θ_t, the policy's public parameters and t; for a
    counts-first policy also which of the round's two exchanges this is (``exchange``)."""
    policy = ConfigRecord({key: _config_value(value) for key, value in params.items()})
    round_record = {ROUND: int(round_number)}
    if exchange is not Exchange.ROUND:
        round_record[EXCHANGE] = exchange.value
    return RecordDict(
        {
            MODEL: ArrayRecord({MODEL: Array(np.ascontiguousarray(model, dtype=np.float64))}),
            POLICY: policy,
            ROUND: ConfigRecord(round_record),
        }
    )


def read_train(content: RecordDict) -> tuple[np.ndarray, dict[str, Any], int]:
    """(θ_t, policy parameters, round) from a train instruction."""
    model = content.array_records[MODEL][MODEL].numpy()
    params = dict(content.config_records[POLICY])
    return model, params, int(content.config_records[ROUND][ROUND])


def read_exchange(content: RecordDict) -> Exchange:
    """Which exchange of its round a train instruction asks for (:class:`Exchange`)."""
    return Exchange(str(content.config_records[ROUND].get(EXCHANGE, Exchange.ROUND.value)))


def evaluate_content(model: np.ndarray, round_number: int) -> RecordDict:
    """The instruction of a clients' evaluation: the model released after round ``round_number``."""
    return RecordDict(
        {
            MODEL: ArrayRecord({MODEL: Array(np.ascontiguousarray(model, dtype=np.float64))}),
            ROUND: ConfigRecord({ROUND: int(round_number)}),
        }
    )


def read_evaluate(content: RecordDict) -> tuple[np.ndarray, int]:
    """(model, round) from an evaluate instruction."""
    return content.array_records[MODEL][MODEL].numpy(), int(content.config_records[ROUND][ROUND])


def evaluation_reply_content(vector: np.ndarray) -> RecordDict:
    """A client's evaluation reply: its evaluation vector alone."""
    array = Array(np.ascontiguousarray(vector, dtype=np.float64))
    return RecordDict({EVALUATION: ArrayRecord({EVALUATION: array})})


def reply_arrays(exchange: Exchange) -> tuple[str, ...]:
    """The arrays a reply in ``exchange`` holds: the reports alone in a counts-first round's
    first exchange, the contribution alone in its second, both otherwise."""
    if exchange is Exchange.COUNTS:
        return (REPORTS,)
    if exchange is Exchange.UPDATES:
        return (CONTRIBUTION,)
    return (CONTRIBUTION, REPORTS)


def reply_content(sums: RoundSums, with_diagnostics: bool, exchange: Exchange = Exchange.ROUND) -> RecordDict:
    """One client's reply: what ``exchange`` carries of its contribution and report vector
    (:func:`reply_arrays`), and, simulated, diagnostics (with its contribution only)."""
    vectors = {CONTRIBUTION: sums.contribution_sum, REPORTS: sums.report_sum}
    content = RecordDict(
        {
            UPDATE: ArrayRecord(
                {
                    name: Array(np.ascontiguousarray(vectors[name], dtype=np.float64))
                    for name in reply_arrays(exchange)
                }
            )
        }
    )
    if with_diagnostics and exchange is not Exchange.COUNTS:
        diagnostics = sums.diagnostics
        content[DIAGNOSTICS] = MetricRecord(
            {name: [float(v) for v in getattr(diagnostics, name)] for name in DIAGNOSTIC_FIELDS}
        )
    return content


def _config_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [float(v) for v in value]
    if isinstance(value, list | tuple):
        return [float(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


POLICY_KEY = "fairclip.policy"
PARAM_PREFIX = "fairclip.param."
BROADCAST_PREFIX = "fairclip.broadcast."
"""Keys of fairclip's entries in a train config of the user's own Flower app
(:class:`fairclip.server.dp_strategy.DifferentialPrivacy` and :func:`fairclip.client.mod.fairclip_mod`)."""


def policy_reference(policy: Any) -> str:
    """How a client finds ``policy``'s class: its built-in name, else ``module:QualifiedName``."""

    if POLICIES.get(policy.name) is type(policy):
        return policy.name
    return f"{type(policy).__module__}:{type(policy).__qualname__}"


def write_policy_config(config: ConfigRecord, policy: Any, params: dict[str, Any]) -> None:
    """Put the policy (its reference and parameters) and its public broadcast into ``config``."""
    config[POLICY_KEY] = policy_reference(policy)
    for key, value in policy.params:
        config[PARAM_PREFIX + key] = _config_value(value)
    for key, value in params.items():
        config[BROADCAST_PREFIX + key] = _config_value(value)


def read_policy_config(config: ConfigRecord) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """(policy reference, parameters, broadcast) from a train config, or ``None`` if it has none."""
    if POLICY_KEY not in config:
        return None
    params = {k.removeprefix(PARAM_PREFIX): v for k, v in config.items() if k.startswith(PARAM_PREFIX)}
    broadcast = {
        k.removeprefix(BROADCAST_PREFIX): v for k, v in config.items() if k.startswith(BROADCAST_PREFIX)
    }
    return str(config[POLICY_KEY]), params, broadcast


def flatten(arrays: ArrayRecord) -> np.ndarray:
    """An ArrayRecord's arrays as one float64 vector, in the record's key order."""
    parts = [np.asarray(array, dtype=np.float64).reshape(-1) for array in arrays.to_numpy_ndarrays()]
    return np.concatenate(parts) if parts else np.zeros(0)


def unflatten(vector: np.ndarray, template: ArrayRecord) -> ArrayRecord:
    """``vector`` cut into arrays of ``template``'s keys, shapes and dtypes."""
    arrays, start = {}, 0
    for key, array in zip(template.keys(), template.to_numpy_ndarrays(), strict=True):
        stop = start + array.size
        arrays[key] = Array(np.asarray(vector[start:stop], dtype=array.dtype).reshape(array.shape))
        start = stop
    if start != vector.shape[0]:
        raise ValueError(f"a vector of {vector.shape[0]} values for arrays of {start}")
    return ArrayRecord(arrays)
