"""The Flower ``ServerApp`` of fairclip: ``flwr run .`` and real SuperLink deployments.

1. Resolve the run configuration (:mod:`fairclip.sims.flower_config`): the same keys as ``--set``.
2. Wait for ``federation.num_clients`` nodes and ask each which client it is (its
   ``partition-id``) and which cohort it belongs to.
3. Run the rounds with :class:`fairclip.server.strategy.PolicyStrategy` over the run's
   :class:`fairclip.sims.engine.RunServer` -- the object the local and Ray engines drive -- and
   write ``rounds.csv`` and ``summary.json`` into ``out`` (atomically, after every round).

DP noise and client sampling follow ``seed`` when the run configuration sets it; otherwise
they come from operating-system entropy, and the log says which (DESIGN section 6).

The app is a composition root: it reads scenarios and writes results through
:mod:`fairclip.sims` (the only ``server/`` module that does).
"""

from __future__ import annotations

import time
from logging import ERROR, INFO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from fairclip.client.protocol import IDENTIFY, MODEL
from fairclip.server.strategy import PolicyStrategy

app = ServerApp()

REPLY_TIMEOUT_SECONDS = 600.0
"""How long a round waits for replies; a client that has not answered by then is left out."""


class FederationError(RuntimeError):
    """The connected nodes do not form the configured federation."""


@app.main()
def main(grid: Grid, context: Context) -> None:
    from fairclip.sims.data import DataError
    from fairclip.sims.errors import ConfigError

    try:
        run_federation(grid, context)
    except (ConfigError, DataError, FederationError) as error:
        log(ERROR, "fairclip: error: %s", error)
        raise SystemExit(2) from None


def run_federation(grid: Grid, context: Context) -> None:
    """Everything :func:`main` does, with errors left to the caller."""
    from fairclip.sims.engine import RunResult, RunServer, build_task
    from fairclip.sims.flower_config import flower_run
    from fairclip.sims.outputs import write_run

    run = flower_run(dict(context.run_config))
    config = run.config
    if run.seeded:
        log(
            INFO,
            "fairclip: sampling and DP noise follow seed=%d (reproducible; set no seed in production)",
            config.seed,
        )
    else:
        log(INFO, "fairclip: sampling and DP noise drawn from operating-system entropy (no seed set)")
    task = build_task(config, run.data_dir)
    result = RunResult()
    server = RunServer(config, task, result, seeded=run.seeded)
    nodes, cohorts = identify_nodes(
        grid, config.federation.num_clients, len(task.cohort_names), run.node_wait
    )
    out = run.out.resolve()

    def write_outputs(_row: object = None) -> None:
        write_run(out, result.rows, result.summary, result.model)

    strategy = PolicyStrategy(server, nodes, cohorts, on_round=write_outputs)
    log(
        INFO,
        "fairclip: %s on %s, %d rounds; results in %s",
        config.strategy.name,
        config.scenario.name,
        server.rounds_to_run,
        out,
    )
    try:
        strategy.start(
            grid,
            ArrayRecord({MODEL: Array(server.model)}),
            num_rounds=server.rounds_to_run,
            timeout=REPLY_TIMEOUT_SECONDS,
        )
    finally:
        server.finish()
        write_outputs()
    if result.stop_reason:
        log(INFO, "fairclip: %s", result.stop_reason)
    claim = result.summary["privacy"]
    log(
        INFO,
        "fairclip: finished %d rounds; epsilon=%s at delta=%s (%s)",
        server.rounds_completed,
        claim["epsilon"],
        claim["delta"],
        claim["accountant"],
    )


def identify_nodes(
    grid: Grid, num_clients: int, num_cohorts: int, wait_seconds: float
) -> tuple[dict[int, int], np.ndarray]:
    """Client id -> node id for every connected node, and each client's cohort."""
    deadline = time.monotonic() + wait_seconds
    node_ids = list(grid.get_node_ids())
    while len(node_ids) < num_clients and time.monotonic() < deadline:
        time.sleep(1.0)
        node_ids = list(grid.get_node_ids())
    if len(node_ids) != num_clients:
        raise FederationError(f"{len(node_ids)} nodes connected, but federation.num_clients={num_clients}")
    query = [
        Message(RecordDict({IDENTIFY: ConfigRecord({})}), dst_node_id=node, message_type=MessageType.QUERY)
        for node in node_ids
    ]
    nodes: dict[int, int] = {}
    cohorts = np.full(num_clients, -1, dtype=np.int64)
    for reply in grid.send_and_receive(query, timeout=wait_seconds):
        node = reply.metadata.src_node_id
        if reply.has_error():
            raise FederationError(f"node {node} could not join: {reply.error.reason}")
        identity = reply.content.config_records[IDENTIFY]
        client, total, cohort = (int(identity[key]) for key in ("partition-id", "num-partitions", "cohort"))
        if total != num_clients or not 0 <= client < num_clients or not 0 <= cohort < num_cohorts:
            raise FederationError(f"node {node} reports partition {client} of {total}, cohort {cohort}")
        if client in nodes:
            raise FederationError(f"nodes {nodes[client]} and {node} both claim partition-id={client}")
        nodes[client] = node
        cohorts[client] = cohort
    if len(nodes) != num_clients:
        missing = sorted(set(range(num_clients)) - set(nodes))
        raise FederationError(f"no node answered for partition-id(s) {missing}")
    return nodes, cohorts
