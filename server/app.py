"""fairclip's Flower ``ServerApp``: ``flwr run .`` and real SuperLink deployments.

:data:`server_app` is the app that ``pyproject.toml`` names. :func:`make_server_app` turns a
function that runs one federation (the grid and the run's context in, results written) into a
ServerApp that refuses a run it cannot start -- a bad configuration, data or federation -- with
its reason logged in one line, and marks it failed instead of losing its log. fairclip's own
federation is :func:`run_federation`: resolve the run configuration (the same keys as
``--set``), wait for ``federation.num_clients`` nodes and ask each which client it is
(:mod:`fairclip.server.nodes`), run the rounds with :class:`fairclip.server.strategy.PolicyStrategy`
over the run a simulation's executors drive too, and write after every round (atomically):

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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from logging import ERROR, INFO, WARNING
from typing import Any

from flwr.app import Array, ArrayRecord, Context
from flwr.app.exception import AppExitException
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.exit import ExitCode

from fairclip.client.flower_logging import drop_opacus_root_handler
from fairclip.client.protocol import MODEL
from fairclip.scenarios.data import DataError
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.flower_config import FlowerRun, flower_run
from fairclip.scenarios.tasks import build_task
from fairclip.server.nodes import NODE_COLUMNS, FederationError, identify_nodes
from fairclip.server.observers import RunObserver, notify_start
from fairclip.server.outputs import write_server_run
from fairclip.server.run import Run
from fairclip.server.strategy import EVENT_COLUMNS, REPLY_TIMEOUT_SECONDS, PolicyStrategy
from fairclip.strategies.registry import policy_name


class RunRefused(AppExitException):
    """The run cannot start as configured (configuration, data or federation): its reason is
    logged in one line first. An ``AppExitException`` rather than ``SystemExit``, so that Flower
    uploads the ServerApp's log and marks the run failed instead of losing both."""

    exit_code = ExitCode.SERVERAPP_STRATEGY_PRECONDITION_UNMET


def make_server_app(
    run_federation: Callable[[Grid, Context], None], refusals: tuple[type[Exception], ...]
) -> ServerApp:
    """A ServerApp whose main runs ``run_federation``; an error of a type in ``refusals`` ends
    the run as :class:`RunRefused` with ``fairclip: error: <reason>`` logged."""
    drop_opacus_root_handler()  # else Flower prints every line twice
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            run_federation(grid, context)
        except refusals as error:
            log(ERROR, "fairclip: error: %s", error)
            raise RunRefused(str(error)) from None

    return app


def run_federation(grid: Grid, context: Context, observers: Sequence[RunObserver] = ()) -> None:
    """One federation of fairclip's ServerApp (module docstring of :mod:`fairclip.server.app`);
    errors are left to the app, which refuses the run with their reason. ``observers`` see the
    run as in a simulation (:class:`fairclip.server.observers.RunObserver`): ``on_start`` once the
    nodes are identified, ``on_round`` after each round's files are written, ``on_finish`` at
    the end (after an interruption too)."""

    run = flower_run(dict(context.run_config))
    config = run.config
    task = build_task(config, run.data_dir)
    server = Run(
        config,
        task,
        seeded=run.not_private,
        secure_noise_default=True,
        not_private=run.not_private,
        simulation=False,
    )
    log_randomness(run, server.noise_source)
    secure = config.privacy.secure_aggregation
    if config.evaluation.clients and not secure and not server.policy.needs_cohorts:
        log(
            WARNING,
            "fairclip: [evaluation] clients without secure aggregation: each evaluating node's "
            "reply shows the server which cohort it is in (the slot it fills); set "
            "privacy.secure_aggregation=true to keep cohorts on the nodes",
        )
    if secure:
        from fairclip.server.secure_aggregation import SecureAggregation, summary_of
        from fairclip.strategies.errors import PolicyConfigError

        try:  # the field must hold the sum of N quantised vectors of this model
            summary_of(config, server.policy, server.model.shape[0])
        except PolicyConfigError as error:
            raise ConfigError(str(error)) from None
    federation = identify_nodes(
        grid,
        config.federation.num_clients,
        len(task.cohort_names),
        run.node_wait,
        needs_cohorts=server.policy.needs_cohorts and not secure,
        registered=run.node_partitions,
    )
    out = run.out.resolve()
    strategy = PolicyStrategy(
        server,
        federation.nodes,
        config.federation.num_clients,
        federation.cohorts,
        diagnostics_allowed=run.simulation_diagnostics,
        secure=SecureAggregation.from_config(config, server.policy.num_cohorts, str(context.run_id))
        if secure
        else None,
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
        policy_name(config.policy.name),
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
"""fairclip's Flower ``ServerApp`` (``pyproject.toml``'s ``serverapp``): :func:`run_federation`."""
