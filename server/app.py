"""fairclip's Flower ``ServerApp``: ``flwr run .`` and real SuperLink deployments.

:func:`server_app` turns a function that runs one federation (the grid and the run's context in,
results written) into a ServerApp that refuses a run it cannot start -- a bad configuration, data
or federation -- with its reason logged in one line, and marks it failed instead of losing its
log. :mod:`fairclip.sims.flower_apps` gives it fairclip's run: resolve the run configuration (the
same keys as ``--set``), wait for ``federation.num_clients`` nodes and ask each which client it is
(:mod:`fairclip.server.nodes`), run the rounds with :class:`fairclip.server.strategy.PolicyStrategy`
over the round server the local and Ray engines drive, and write after every round (atomically):

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

from collections.abc import Callable
from logging import ERROR

from flwr.app import Context
from flwr.app.exception import AppExitException
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.exit import ExitCode

from fairclip.client.flower_logging import drop_opacus_root_handler

REPLY_TIMEOUT_SECONDS = 600.0
"""How long a round waits for replies; a client that has not answered by then is left out."""


class RunRefused(AppExitException):
    """The run cannot start as configured (configuration, data or federation): its reason is
    logged in one line first. An ``AppExitException`` rather than ``SystemExit``, so that Flower
    uploads the ServerApp's log and marks the run failed instead of losing both."""

    exit_code = ExitCode.SERVERAPP_STRATEGY_PRECONDITION_UNMET


def server_app(
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
