"""The Flower ``ServerApp`` of fairclip: ``flwr run .`` and real SuperLink deployments.

1. Resolve the run configuration (:mod:`fairclip.sims.flower_config`): the same keys as ``--set``.
2. Wait for ``federation.num_clients`` nodes and ask each which client it is (its
   ``partition-id``), and its cohort only where the policy needs it (:mod:`fairclip.server.nodes`).
3. Run the rounds with :class:`fairclip.server.strategy.PolicyStrategy` over the run's
   :class:`fairclip.sims.engine.RunServer` -- the object the local and Ray engines drive -- and
   write the outputs into ``out`` after every round (atomically):

   - the **public release**: ``rounds.csv`` (only values DP covers or that are public: bound,
     noise, ε, the policy's state, the noisy counts, the evaluation of the released model on the
     server's own test data), ``summary.json`` (ε with δ, the accountant, q, T and the noise
     multipliers) and ``model.npy``;
   - the **server-internal record** ``server-internal/`` (not DP-protected, see its README.txt):
     exact counts of sampled, accepted, dropped and missing replies, why each reply was dropped,
     round timings, which node is which client, and simulation diagnostics where enabled.

Nothing exact goes to the log at INFO level or into the MetricRecords Flower logs and keeps.
The DP noise comes from OpenDP's exact sampler unless ``privacy.secure_noise = false``; client
sampling (and, without secure noise, the noise) follows a seed only where the run configuration
gives one, and the log says which applies (docs/design.md, section 6).

The app is a composition root: it reads scenarios and writes results through
:mod:`fairclip.sims` (the only ``server/`` module that does).
"""

from __future__ import annotations

from logging import ERROR, INFO
from typing import TYPE_CHECKING

from flwr.app import Array, ArrayRecord, Context
from flwr.app.exception import AppExitException
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.exit import ExitCode

from fairclip.client.flower_logging import drop_opacus_root_handler
from fairclip.client.protocol import MODEL
from fairclip.server.nodes import NODE_COLUMNS, FederationError, identify_nodes
from fairclip.server.strategy import EVENT_COLUMNS, PolicyStrategy

if TYPE_CHECKING:
    from fairclip.sims.flower_config import FlowerRun

app = ServerApp()
drop_opacus_root_handler()  # else Flower prints every line twice

REPLY_TIMEOUT_SECONDS = 600.0
"""How long a round waits for replies; a client that has not answered by then is left out."""


class RunRefused(AppExitException):
    """The run cannot start as configured (configuration, data or federation): its reason is
    logged in one line first. An ``AppExitException`` rather than ``SystemExit``, so that Flower
    uploads the ServerApp's log and marks the run failed instead of losing both."""

    exit_code = ExitCode.SERVERAPP_STRATEGY_PRECONDITION_UNMET


@app.main()
def main(grid: Grid, context: Context) -> None:
    from fairclip.sims.data import DataError
    from fairclip.sims.errors import ConfigError

    try:
        run_federation(grid, context)
    except (ConfigError, DataError, FederationError) as error:
        log(ERROR, "fairclip: error: %s", error)
        raise RunRefused(str(error)) from None


def run_federation(grid: Grid, context: Context) -> None:
    """Everything :func:`main` does, with errors left to the caller."""
    from fairclip.sims.engine import RunResult, RunServer, build_task
    from fairclip.sims.flower_config import flower_run
    from fairclip.sims.outputs import write_server_run

    run = flower_run(dict(context.run_config))
    config = run.config
    task = build_task(config, run.data_dir)
    result = RunResult()
    server = RunServer(config, task, result, seeded=run.seeded, secure_noise_default=True)
    log_randomness(run, server.noise_source)
    federation = identify_nodes(
        grid,
        config.federation.num_clients,
        len(task.cohort_names),
        run.node_wait,
        needs_cohorts=server.policy.needs_cohorts,
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
            result.rows,
            result.public_columns,
            result.summary,
            result.model,
            {
                "nodes": (federation.table(), NODE_COLUMNS),
                "refused_nodes": (refused, ["node", "reason"]),
                "replies": (strategy.events, EVENT_COLUMNS),
            },
        )

    strategy.on_round = write_outputs
    log(
        INFO,
        "fairclip: %s on %s, %d rounds; results in %s (exact counts only in its server-internal/)",
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
    except BaseException:
        server.finish(interrupted=True)
        write_outputs()
        raise
    server.finish()
    write_outputs()
    if result.stop_reason:
        log(INFO, "fairclip: %s", result.stop_reason)
    claim = result.summary["privacy"]
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
    if run.seeded:
        log(
            INFO,
            "fairclip: client sampling follows seed=%d, given by %s (a test run: set no seed in production)",
            run.config.seed,
            run.seed_source,
        )
    else:
        log(INFO, "fairclip: client sampling drawn from operating-system entropy (no seed given)")
    log(INFO, "fairclip: DP noise from %s", noise_source)
