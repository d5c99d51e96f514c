"""fairclip's Flower apps, wired to its scenarios: what ``pyproject.toml`` names for ``flwr run .``.

``client_app`` is :class:`fairclip.client.app.FairclipClient` over the scenario a run's
configuration names; ``server_app`` is :func:`fairclip.server.app.server_app` running
:func:`run_federation`. ``client/`` and ``server/`` hold the apps' machinery and import nothing
of ``sims``; this module composes them with the scenarios, the run server and the output files.
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

from flwr.app import Array, ArrayRecord, Context
from flwr.common import log
from flwr.serverapp import Grid

from fairclip.client.app import ClientRun, FairclipClient
from fairclip.client.protocol import MODEL
from fairclip.server.app import REPLY_TIMEOUT_SECONDS
from fairclip.server.app import server_app as make_server_app
from fairclip.server.nodes import NODE_COLUMNS, FederationError, identify_nodes
from fairclip.server.strategy import EVENT_COLUMNS, PolicyStrategy
from fairclip.sims.data import DataError
from fairclip.sims.errors import ConfigError
from fairclip.sims.flower_config import FlowerRun, flower_run

if TYPE_CHECKING:
    from fairclip.sims.engine import RunObserver


def load_client_run(run_config: dict[str, Any]) -> ClientRun:
    """A node's view of a run: the resolved configuration, and its scenario's task on demand."""
    from fairclip.sims.tasks import build_task

    run = flower_run(run_config)
    return ClientRun(
        num_clients=run.config.federation.num_clients,
        strategy_name=run.config.strategy.name,
        strategy_params=dict(run.config.strategy.params),
        simulation_diagnostics=run.simulation_diagnostics,
        task=lambda _private: build_task(run.config, run.data_dir),
    )


clients = FairclipClient(load_client_run)
client_app = clients.app()


def run_federation(grid: Grid, context: Context, observers: Sequence[RunObserver] = ()) -> None:
    """One federation of fairclip's ServerApp (module docstring of :mod:`fairclip.server.app`);
    errors are left to the app, which refuses the run with their reason. ``observers`` see the
    run as in a simulation (:class:`fairclip.sims.engine.RunObserver`): ``on_start`` once the
    nodes are identified, ``on_round`` after each round's files are written, ``on_finish`` at
    the end (after an interruption too)."""
    from fairclip.sims.engine import RunServer, notify_start
    from fairclip.sims.flower_config import flower_run
    from fairclip.sims.outputs import write_server_run
    from fairclip.sims.tasks import build_task

    run = flower_run(dict(context.run_config))
    config = run.config
    task = build_task(config, run.data_dir)
    server = RunServer(
        config,
        task,
        seeded=run.not_private,
        secure_noise_default=True,
        not_private=run.not_private,
        simulation=False,
    )
    log_randomness(run, server.noise_source)
    federation = identify_nodes(
        grid,
        config.federation.num_clients,
        len(task.cohort_names),
        run.node_wait,
        needs_cohorts=server.policy.needs_cohorts,
        registered=run.node_partitions,
    )
    out = run.out.resolve()
    strategy = PolicyStrategy(
        server,
        federation.nodes,
        config.federation.num_clients,
        federation.cohorts,
        diagnostics_allowed=run.simulation_diagnostics,
    )
    refused = [{"node": node, "reason": reason} for node, reason in sorted(federation.refused.items())]

    def write_outputs(_row: object = None) -> None:
        write_server_run(
            out,
            server.rows,
            server.public_columns,
            server.summary,
            server.evaluated_model,
            {
                "nodes": (federation.table(), NODE_COLUMNS),
                "refused_nodes": (refused, ["node", "reason"]),
                "replies": (strategy.events, EVENT_COLUMNS),
            },
        )

    def round_finished(row: dict[str, Any]) -> None:
        write_outputs()
        for observer in observers:
            observer.on_round(row, server)

    def finished(interrupted: bool) -> None:
        server.finish(interrupted=interrupted)
        write_outputs()
        for observer in observers:
            observer.on_finish(server)

    strategy.on_round = round_finished
    log(
        INFO,
        "fairclip: %s on %s, %d rounds; results in %s (exact counts only in its server-internal/)",
        config.strategy.name,
        config.scenario.name,
        server.rounds_to_run,
        out,
    )
    notify_start(observers, server)
    try:
        strategy.start(
            grid,
            ArrayRecord({MODEL: Array(server.model)}),
            num_rounds=server.rounds_to_run,
            timeout=REPLY_TIMEOUT_SECONDS,
        )
    except BaseException:
        finished(interrupted=True)
        raise
    finished(interrupted=False)
    if server.stop_reason:
        log(INFO, "fairclip: %s", server.stop_reason)
    claim = server.summary["privacy"]
    log(
        INFO,
        "fairclip: finished %d rounds; epsilon=%.4g at delta=%s (%s)",
        server.rounds_completed,
        float(claim["epsilon"]),
        claim["delta"],
        claim["accountant"],
    )


def log_randomness(run: FlowerRun, noise_source: str) -> None:
    """Say where client sampling and DP noise come from (docs/design.md, section 6)."""
    if run.not_private:
        log(
            WARNING,
            "fairclip: NOT PRIVATE: client sampling and DP noise follow seed=%d (run-config "
            "not-private=true), so epsilon is reported as inf; for tests and debugging only",
            run.config.seed,
        )
    else:
        log(INFO, "fairclip: client sampling drawn from operating-system entropy")
    log(INFO, "fairclip: DP noise from %s", noise_source)


REFUSALS = (ConfigError, DataError, FederationError)
"""The errors for which fairclip's ServerApp refuses a run with their reason."""

server_app = make_server_app(run_federation, REFUSALS)
