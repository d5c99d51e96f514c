"""The round loop of a simulation (docs/design.md, section 2), shared by every executor.

One round t:

1. Poisson sampling of clients with rate q (:func:`fairclip.strategies.randomness.poisson_sample`).
2. The policy broadcasts its public parameters; the sampled clients train and their updates
   go through the policy's client side (a counts-first policy asks them twice: their counts,
   then their updates clipped at the bounds those counts set, :attr:`Policy.counts_first`).
   *Where* that happens is the executor's only job
   (:class:`ClientExecutor`): in this process, or in Ray actors.
3. The policy's server side noises the sums with the sensitivity of this round, forms Δ̂ and
   moves its state; the server optimizer steps the model.
4. ε after t rounds is recorded; the run stops before a round that would exceed the budget.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from fairclip.scenarios.config import RunConfig
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.tasks import Task
from fairclip.server.checkpoint import Checkpointing
from fairclip.server.interrupts import interrupts_deferred
from fairclip.server.observers import RoundCallback, RunObserver, RunResult, notify_start
from fairclip.server.run import Run
from fairclip.sims.executors.local import ClientExecutor, LocalExecutor
from fairclip.strategies import Policy
from fairclip.strategies.aggregation import Exchange


def simulate(
    config: RunConfig,
    task: Task,
    executor_factory: Callable[[Task, Policy], ClientExecutor] = LocalExecutor,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    observers: Sequence[RunObserver] = (),
    checkpoint: Checkpointing | None = None,
) -> RunResult:
    """Run every round of ``config`` and return what it produced. ``observers`` (and
    ``on_round``, a plain callback per row) see every finished round and the end; after an
    interruption they see the end too, with the summary describing the last finished round
    (``status = "interrupted"``), before the interruption propagates.

    With ``checkpoint``, a run that has one continues after its last finished round (the
    observers see the rounds computed here), and the checkpoint is written on its schedule, at
    an interruption and at the end (:mod:`fairclip.server.checkpoint`)."""
    server = Run(config, task)
    if checkpoint is not None:
        checkpoint.resume(server)
    watching = [*observers, *([RoundCallback(on_round)] if on_round is not None else [])]
    # a round shown before its checkpoint is written is counted first, where a resumed run would
    # compute it again with fresh noise (fairclip.server.checkpoint)
    counts_releases = checkpoint is not None and bool(watching) and not server.noise_reproducible
    execute = executor_factory(task, server.policy)
    server.execution = getattr(execute, "execution", None)
    if config.evaluation.clients and not hasattr(execute, "evaluate_clients"):
        raise ConfigError(
            f"evaluation.clients: the executor {type(execute).__name__} cannot have clients evaluate "
            "the model (it has no evaluate_clients)"
        )
    notify_start(watching, server)
    try:
        begin_round = getattr(task, "begin_round", None)
        for round_number in range(server.rounds_completed + 1, server.rounds_to_run + 1):
            client_ids = server.sample(round_number)
            if begin_round is not None:  # a batch term of the training objective (FairLens)
                begin_round(server.model, client_ids, round_number)
            server.note_last_epoch(round_number, client_ids)  # training.train_loss = "last-epoch"
            if server.policy.counts_first:
                counts = execute(server.model, client_ids, round_number, server.broadcast(), Exchange.COUNTS)
                server.release_counts(round_number, counts)
                sums = execute(server.model, client_ids, round_number, server.broadcast(), Exchange.UPDATES)
            else:
                sums = execute(server.model, client_ids, round_number, server.broadcast())
            row = server.finish_round(round_number, sums)
            if server.evaluates_clients(round_number):  # a release of its own, after the round's
                evaluation = server.config.evaluation
                evaluators = server.evaluation_sample(round_number)
                total = execute.evaluate_clients(
                    server.model, evaluators, evaluation.max_examples, evaluation.loss_bound
                )
                server.finish_evaluation(round_number, total, len(evaluators))
            if counts_releases:
                checkpoint.note_released(server)
            for observer in watching:
                observer.on_round(row, server)
            if checkpoint is not None:
                checkpoint.after_round(server)
    except BaseException as error:
        with contextlib.suppress(Exception):  # the interruption, not this, is what the caller sees
            server.finish(interrupted=True, error=error)
        saved = False
        if checkpoint is not None and not server.between_releases:
            with interrupts_deferred():  # a second Ctrl-C does not cut the write short
                saved = checkpoint.save(server)
        if saved or not counts_releases or _noted(checkpoint, server):
            for observer in watching:
                with contextlib.suppress(Exception):  # each writes what it can; the error propagates
                    observer.on_finish(server)
        raise
    result = server.finish()
    if checkpoint is not None:
        checkpoint.save(server)
    for observer in watching:
        observer.on_finish(server)
    return result


def _noted(checkpoint: Checkpointing, server: Run) -> bool:
    """Whether ``server``'s released rounds could be counted (:meth:`Checkpointing.note_released`);
    where they could not, nobody may be shown them."""
    try:
        checkpoint.note_released(server)
    except Exception:  # a full disk: the interruption already propagating is what the caller sees
        return False
    return True
