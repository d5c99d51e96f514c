"""One run of a scenario on the server: the rounds, the evaluation schedule, the rows and the summary.

:class:`Run` is what a deployment's ServerApp (:mod:`fairclip.server.app`) and a simulation's
round loop (:func:`fairclip.sims.executors.loop.simulate`) both drive: ``sample``, send
``broadcast()`` and ``model`` to the sampled clients, collect their sums, ``finish_round``; at the
end ``finish``. Its observers (:class:`RunObserver`: the file writer, a progress bar, a tracker,
a user's callback) see every round and the end.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from fairclip.scenarios.config import RunConfig
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.tasks import Task
from fairclip.scenarios.tasks.clipping_errors import keep_one_error
from fairclip.server.interrupts import interrupts_deferred
from fairclip.server.last_epoch import WEIGHTINGS, LastEpoch
from fairclip.server.observers import RunResult
from fairclip.server.optimizer import server_optimizer
from fairclip.server.privacy_plan import json_number, plan_privacy
from fairclip.server.provenance import provenance
from fairclip.server.rounds import Rounds
from fairclip.server.secure_noise import noise_source, secure_sampler
from fairclip.strategies import Policy, ServerRound, build_policy
from fairclip.strategies import evaluation as client_evaluation
from fairclip.strategies.accounting import Accountant, PrivacyClaim
from fairclip.strategies.aggregation import CLIENT_DIAGNOSTICS, RoundSums
from fairclip.strategies.base import Broadcast, DPEvent, GaussianSampler
from fairclip.strategies.errors import one_line
from fairclip.strategies.randomness import Stream, poisson_sample
from fairclip.strategies.registry import policy_name


def in_background(function: Callable[..., Any], *args: Any) -> Future:
    """``function(*args)`` in a daemon thread of its own; its result (or error) in the future.
    A thread per call rather than a shared pool: a pool's thread does not survive a fork."""
    future: Future = Future()

    def resolve() -> None:
        try:
            future.set_result(function(*args))
        except BaseException as error:  # handed to whoever asks for the result
            future.set_exception(error)

    threading.Thread(target=resolve, name="fairclip-background", daemon=True).start()
    return future


class Run:
    """One simulated (or Flower-driven) run of a scenario: the round server built from the run's
    configuration and task, the evaluation schedule, the rows of ``rounds.csv`` and the summary.

    The rounds themselves -- noise with the sensitivity of the round that clipped, the bound
    update, the server optimizer, the accountant fed with each round's DP event -- are
    :class:`fairclip.server.rounds.Rounds`'s, which the local and Ray executors and the
    Flower ``ServerApp`` drive through this object the same way: ``sample``, send ``broadcast()``
    and ``model`` to the sampled clients, collect their :class:`RoundSums`, ``finish_round``.

    ``seeded=False`` (a deployment, docs/design.md, section 6) draws client sampling and DP noise
    from operating-system entropy instead of the run's seed. ``not_private`` marks a deployment
    whose sampling and noise follow a seed all the same (a test's ``not-private`` run): whoever
    knows the seed can subtract the noise, so its public outputs report ε as infinite, with the
    mechanism's ε beside it as ``privacy.mechanism_epsilon`` and ``privacy.guarantee = false``.
    """

    def __init__(
        self,
        config: RunConfig,
        task: Task,
        *,
        seeded: bool = True,
        secure_noise_default: bool = False,
        not_private: bool = False,
        simulation: bool = True,
    ):
        self.config = config
        self.task = task
        self.seeded = seeded
        self.not_private = not_private
        self.simulation = simulation
        """Whether the run's summary may say what only a simulation knows (the ServerApp's is
        public and knows no client's diagnostics)."""
        self.dropped_rounds: list[int] = []
        """Rounds in which every sampled client's update was not finite (a simulation's flag)."""
        self.couples_clients = config.training.objective == "fairlens"
        """Whether each client's update depends on the other sampled clients' data (FairLens's
        batch regularisers, :mod:`fairclip.scenarios.tasks.fairlens`): then no contribution's sensitivity is
        the noise's, and the run claims no ε (:meth:`_claim`)."""
        secure = config.privacy.secure_noise
        self.secure_noise = secure_noise_default if secure is None else secure
        """Whether the DP noise comes from OpenDP's exact sampler (``privacy.secure_noise``, or
        the caller's default where unset: on for the Flower ServerApp, off for simulations)."""
        policy = build_policy(config.policy.name, config.policy.params, num_cohorts=len(task.cohort_names))
        model = task.initial_model()
        self.plan = plan_privacy(config, policy, model.shape[0])
        self._secure_sampler = secure_sampler(self.secure_noise and policy.private)
        evaluation = config.evaluation
        self._evaluation_sampler = self._secure_sampler or secure_sampler(
            self.secure_noise and evaluation.clients
        )
        """The sampler of the clients' evaluation release: OpenDP's exact one where the noise is
        secure (also in a run whose policy adds none)."""
        self.evaluation_releases = 0
        """How many client evaluations were released and accounted (``[evaluation] clients``)."""
        self.last_epoch: LastEpoch | None = None
        """The last epoch's cohort losses and update norms (``training.train_loss =
        "last-epoch"`` or ``"last-epoch-examples"``), from :meth:`note_last_epoch` and
        :meth:`finish_round`; set below, with the run's other settings."""
        self.evaluation_due: int | None = None
        """The round whose model the clients are to evaluate next (:meth:`finish_round` of a round
        :meth:`evaluates_clients`, until :meth:`finish_evaluation`): a snapshot taken in between
        would continue after that round without its evaluation."""
        self._noted_batch: tuple[int, tuple[Any, ...], tuple[Any, ...]] | None = None
        """The batch :meth:`note_last_epoch` measured for the round now training: (round, its
        cohort losses, its cohort update sums), added to :attr:`last_epoch` with the round's
        release, so that a checkpoint written while it trains holds the earlier rounds only."""
        self.client_evaluation: dict[str, Any] | None = None
        """The last client evaluation released: its round, noise and noisy metrics (summary.json)."""
        self.rounds = Rounds(
            policy=policy,
            model=model,
            noise=self.plan.noise,
            sample_rate=config.federation.sample_rate,
            expected_clients=config.expected_clients,
            optimizer=server_optimizer(
                config.training.server_optimizer,
                config.training.server_lr,
                momentum=config.training.server_momentum,
                weight_decay=config.training.weight_decay,
                betas=(config.training.server_beta1, config.training.server_beta2),
                eps=config.training.server_eps,
            ),
            accountant=Accountant(config.privacy.accountant),
            sampler=self._sample,
            noise_source=self._noise,
            evaluator=task.evaluate if evaluation.server else _no_server_test_set,
        )
        if config.privacy.secure_aggregation:
            if simulation:  # the executors sum in clear: claiming secure aggregation would be false
                raise ConfigError(
                    "privacy.secure_aggregation runs in fairclip's Flower apps only (flwr run, "
                    "SuperLink deployments), not in a simulation's executors"
                )
            self.rounds.rounding_slack = config.privacy.secagg_rounding_slack
        self.rows: list[dict[str, Any]] = []
        self.public_columns: set[str] = set()
        """Columns of ``rows`` that DP covers (or that are public anyway) and may be published;
        every other column -- exact counts, simulation diagnostics, what an executor adds -- is
        internal to the server (:func:`fairclip.server.outputs.split_rows`)."""
        self._round_diagnostics: set[str] = set()
        """The other columns of ``rows``, in a simulation: named in the summary's
        ``not_covered_by_dp`` (:meth:`_name_round_diagnostics`)."""
        self.stop_reason: str | None = None
        self.execution: dict[str, Any] | None = None
        """How the executor runs the clients (executor, workers or actors and nodes), where it
        says: the summary's ``provenance.execution``."""
        self._started = (dt.datetime.now(dt.UTC), time.perf_counter())
        self._earlier_pieces: list[dict[str, Any]] = []
        """The pieces of this run computed by earlier processes, oldest first (:meth:`restore`)."""
        self.rounds_released_again = 0
        """Rounds released before an interruption that the checkpoint did not hold, recomputed
        with fresh noise after it, and so accounted twice (:meth:`charge_released_again`)."""
        if config.training.train_loss in WEIGHTINGS:
            rate = config.federation.sample_rate
            self.last_epoch = LastEpoch(len(task.cohort_names), rate, str(config.training.train_loss))
        self._final_claim = in_background(self.plan.epsilon_after, self.rounds_to_run)
        """ε after the last round, computed while the rounds run (PRV for W1's 5 rounds: 0.025 s
        of CPU since the accountants share their RDP work, 0.15 s before; when the summary
        waited for it, 15 % of the run). The accountant's ε for that round is then a cache hit."""
        self.summary = self._summary({}, {})
        self.evaluated_model = model
        """The model that ``summary`` describes (the last evaluated one)."""

    @property
    def policy(self) -> Policy:
        return self.rounds.policy

    @property
    def model(self) -> np.ndarray:
        """θ after the last finished round."""
        return self.rounds.model

    @property
    def state(self) -> Any:
        return self.rounds.state

    @property
    def rounds_completed(self) -> int:
        return self.rounds.rounds_completed

    @property
    def result(self) -> RunResult:
        """What the run produced so far."""
        return RunResult(self.rows, self.summary, self.stop_reason, self.evaluated_model, self.public_columns)

    @property
    def noise_source(self) -> str:
        """Where this run's DP noise comes from, in words (summary.json and the server log)."""
        if not self.policy.private:
            return "none (the non-private reference adds no noise)"
        if self._secure_sampler is not None:
            return "OpenDP's exact Gaussian sampler, operating-system entropy (not reproducible)"
        if self.seeded:
            return f"numpy's Gaussian sampler, seed {self.config.seed} (reproducible)"
        return "numpy's Gaussian sampler, operating-system entropy"

    @property
    def noise_reproducible(self) -> bool:
        """Whether a round computed again draws the same noise (a function of (seed, round));
        not with OpenDP's sampler or operating-system entropy. Always so without noise. With
        ``[evaluation] clients``, the same holds of the evaluation's noise (always drawn)."""
        training = not self.policy.private or (self._secure_sampler is None and self.seeded)
        evaluation = not self.config.evaluation.clients or (self._evaluation_sampler is None and self.seeded)
        return training and evaluation

    @property
    def rounds_to_run(self) -> int:
        """Configured rounds, cut where the next round would exceed the privacy budget (counting
        the rounds accounted twice, :meth:`charge_released_again`)."""
        allowed = self.plan.rounds_allowed
        if self.plan.budget is not None:
            allowed = max(allowed - self.rounds_released_again, self.rounds_completed)
        return min(self.config.training.rounds, allowed)

    def charge_released_again(self, rounds: int) -> None:
        """Account for ``rounds`` rounds that an interrupted process released and that this run
        computes again with fresh noise: each is a release of its own
        (:mod:`fairclip.server.checkpoint`). Refused (:class:`ConfigError`) for a policy that
        noises below its sensitivity: the multipliers of rounds the checkpoint lost are not
        known, and the planned one would undercharge them."""
        if rounds and self.policy.noises_below_sensitivity:
            raise ConfigError(
                f"cannot resume: {rounds} round(s) released before the interruption are not in the "
                f"checkpoint, and policy {self.policy.name!r} noises each round with its own multiplier, "
                "so what they cost is unknown; start the run again (or run with seeded noise, which a "
                "resume recomputes exactly)"
            )
        event = DPEvent.planned(self.plan.noise, self.plan.releases_reports)
        for _ in range(rounds):
            self.rounds.accountant.step(event, self.plan.sample_rate)
        if rounds and self.config.evaluation.clients:
            if self.plan.budget is not None:
                raise ConfigError(
                    f"cannot resume: {rounds} round(s) released before the interruption are not in the "
                    "checkpoint, and with [evaluation] clients and a privacy budget their evaluations "
                    "cannot be charged within the plan; start the run again (or run with seeded noise)"
                )
            # every evaluation the lost rounds may have released, charged again (an upper bound)
            first = self.rounds_completed + 1
            every = self.config.training.eval_every
            lost = range(first, first + rounds)
            again = sum(1 for r in lost if r % every == 0 or r >= self.rounds_to_run)
            for _ in range(again):
                self.rounds.accountant.step(self._evaluation_event, self.plan.sample_rate)
            self.evaluation_releases += again
        self.rounds_released_again += rounds
        claim = self._claim()
        self.summary = {**self.summary, "privacy": claim, "epsilon": claim["epsilon"]}

    def snapshot(self) -> dict[str, Any]:
        """What a later process needs to continue this run after its last finished round
        (:mod:`fairclip.server.checkpoint`): the round server's state, the rows and summary so
        far, and the pieces of run time behind them. No generator state: the run's randomness
        is keyed by (seed, round). Refused between a round's releases (:attr:`between_releases`)."""
        rounds = self.rounds
        if rounds.pending is not None:
            raise RuntimeError(f"round {rounds.pending.number} is half released (its counts only)")
        if self.evaluation_due is not None:
            raise RuntimeError(f"round {self.evaluation_due} is released but its clients' evaluation is not")
        return {
            "rounds_completed": rounds.rounds_completed,
            "model": rounds.model,
            "state": rounds.state,
            "optimizer": rounds.optimizer,
            "accountant_history": list(rounds.accountant.history),
            "last_event": rounds.last_event,
            "rows": self.rows,
            "public_columns": sorted(self.public_columns),
            "summary": self.summary,
            "evaluated_model": self.evaluated_model,
            "pieces": [*self._earlier_pieces, self._piece()],
            "rounds_released_again": self.rounds_released_again,
            "dropped_rounds": list(self.dropped_rounds),
            "evaluation_releases": self.evaluation_releases,
            "client_evaluation": self.client_evaluation,
            "last_epoch_losses": None if self.last_epoch is None else self.last_epoch.state(),
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue from ``snapshot`` (:meth:`snapshot` of a run of the same configuration): the
        next round is the one after its last finished round."""
        rounds = self.rounds
        rounds.rounds_completed = int(snapshot["rounds_completed"])
        rounds.model = snapshot["model"]
        rounds.state = snapshot["state"]
        rounds.optimizer = snapshot["optimizer"]
        rounds.accountant.history = list(snapshot["accountant_history"])
        rounds.last_event = snapshot["last_event"]
        self.rows = list(snapshot["rows"])
        self.public_columns = set(snapshot["public_columns"])
        self._round_diagnostics = {key for row in self.rows for key in row} - self.public_columns
        self.summary = snapshot["summary"]
        self.evaluated_model = snapshot["evaluated_model"]
        self._earlier_pieces = list(snapshot["pieces"])
        self.rounds_released_again = int(snapshot.get("rounds_released_again", 0))
        self.dropped_rounds = list(snapshot.get("dropped_rounds", []))
        self.evaluation_releases = int(snapshot.get("evaluation_releases", 0))
        self.client_evaluation = snapshot.get("client_evaluation")
        if self.last_epoch is not None and snapshot.get("last_epoch_losses") is not None:
            self.last_epoch.restore(snapshot["last_epoch_losses"])
        self._started = (dt.datetime.now(dt.UTC), time.perf_counter())

    def _piece(self) -> dict[str, Any]:
        """This process's piece of the run: when it started, its code, machine and training
        device, its rounds and run time."""
        first = self._earlier_pieces[-1]["last_round"] + 1 if self._earlier_pieces else 1
        static = provenance(self._started[0], 0.0)  # (git and the machine are asked once)
        return {
            "started": self._started[0].isoformat(timespec="seconds"),
            "git_commit": static["git_commit"],
            "machine": static["machine"],
            "device": (self.execution or {}).get("device"),
            "first_round": first,
            "last_round": self.rounds_completed,
            "wall_seconds": round(time.perf_counter() - self._started[1], 3),
        }

    def _provenance(self) -> dict[str, Any]:
        """The summary's provenance. A run continued from a checkpoint counts the run time of
        every piece, starts with the first, and lists the pieces (``pieces``): each one's code,
        machine, training device, rounds and run time (a run continued on another machine, a
        GPU's say, so says where each round ran; ``machine`` and ``execution`` are the last
        piece's)."""
        if not self._earlier_pieces:
            found = provenance(self._started[0], time.perf_counter() - self._started[1])
        else:
            pieces = [*self._earlier_pieces, self._piece()]
            started = dt.datetime.fromisoformat(pieces[0]["started"])
            found = {**provenance(started, sum(p["wall_seconds"] for p in pieces)), "pieces": pieces}
        return {**found, **({"execution": self.execution} if self.execution is not None else {})}

    def _sample(self, round_number: int) -> np.ndarray:
        clients, rate = self.config.federation.num_clients, self.config.federation.sample_rate
        return poisson_sample(self.config.seed if self.seeded else None, round_number, clients, rate)

    def _noise(self, round_number: int) -> np.random.Generator | GaussianSampler:
        return noise_source(self._secure_sampler, self.config.seed if self.seeded else None, round_number)

    def sample(self, round_number: int) -> np.ndarray:
        """Ids of the clients of round ``round_number`` (Poisson sampling with rate q)."""
        return self.rounds.sample(round_number)

    def note_last_epoch(self, round_number: int, client_ids: np.ndarray) -> None:
        """Before round ``round_number`` trains: where ``training.train_loss`` is
        ``"last-epoch"`` or ``"last-epoch-examples"`` and the round is one of the last epoch's,
        add each cohort's loss of the sampled clients' examples under θ_t and the norm of each
        cohort's sum of the updates they train from it (:mod:`fairclip.server.last_epoch`). The
        model is only read, and no step changes. The measurements join the last epoch's sums when
        :meth:`finish_round` releases the round: an interruption while the round trains leaves
        them out of the checkpoint, and the resumed run measures that batch once."""
        last_epoch = self.last_epoch
        if last_epoch is not None and last_epoch.wants(round_number, self.rounds_to_run):
            self._noted_batch = (
                round_number,
                self.task.cohort_batch_losses(self.model, client_ids),
                self.task.cohort_update_sums(self.model, client_ids, round_number),
            )

    def evaluates_clients(self, round_number: int) -> bool:
        """Whether round ``round_number`` is followed by the clients' evaluation of the model it
        released (``[evaluation] clients``: after every reporting round)."""
        return self.config.evaluation.clients and self._reports(round_number)

    def evaluation_sample(self, round_number: int) -> np.ndarray:
        """Ids of the clients that evaluate the model after round ``round_number``: a fresh
        Poisson sample with the run's rate q, from a stream of its own."""
        clients, rate = self.config.federation.num_clients, self.config.federation.sample_rate
        seed = self.config.seed if self.seeded else None
        return poisson_sample(seed, round_number, clients, rate, Stream.EVALUATION_SAMPLING)

    @property
    def _evaluation_event(self) -> DPEvent:
        return DPEvent(self.config.evaluation.noise_multiplier)

    def finish_evaluation(
        self, round_number: int, total: np.ndarray, sampled: int, rounding_slack: float = 0.0
    ) -> dict[str, Any]:
        """Release the clients' evaluation sum ``total`` (Σ of their checked vectors,
        :mod:`fairclip.strategies.evaluation`, ``sampled`` clients asked; a secure sum of
        quantised vectors with ``rounding_slack`` ρ > 0) after round ``round_number``: noise it
        with σ_E·Δ_E·(1+ρ), step the accountant with σ_E at rate q, and add
        the noisy per-cohort accuracy, loss and count, the accuracy gap and the noise's standard
        deviation to the round's row (public) and the summary; in a simulation also the exact
        values (server-internal: DP does not cover them). The row's ε counts this release."""
        evaluation, names = self.config.evaluation, self.task.cohort_names
        row = self.rows[-1] if self.rows else None
        if row is None or row["round"] != round_number:
            raise RuntimeError(f"round {round_number} is not the last finished round")
        with interrupts_deferred():  # the release and its accounting move together
            noise = noise_source(
                self._evaluation_sampler,
                self.config.seed if self.seeded else None,
                round_number,
                Stream.EVALUATION_NOISE,
            )
            noisy, std = client_evaluation.release(
                total,
                noise,
                evaluation.noise_multiplier,
                evaluation.max_examples,
                evaluation.loss_bound,
                rounding_slack,
            )
            self.rounds.accountant.step(self._evaluation_event, self.plan.sample_rate)
            self.evaluation_releases += 1
            self.evaluation_due = None
            per_cohort = client_evaluation.cohort_metrics(noisy, names, evaluation.loss_bound)
            gap = client_evaluation.accuracy_gap(per_cohort)
            public: dict[str, Any] = {
                f"{name}/{metric}": value
                for name, values in per_cohort.items()
                for metric, value in values.items()
            }
            public.update(client_accuracy_gap=gap, client_eval_noise_std=std)
            internal: dict[str, Any] = {"client_eval_sampled": int(sampled)}
            if self.simulation:
                exact = client_evaluation.cohort_metrics(total, names, evaluation.loss_bound)
                for name, values in exact.items():
                    internal.update({f"{name}/{metric}_exact": value for metric, value in values.items()})
                internal["client_accuracy_gap_exact"] = client_evaluation.accuracy_gap(exact)
            self.client_evaluation = {
                "round": round_number,
                "noise_std": std,
                "noise_multiplier": evaluation.noise_multiplier,
                "max_examples": evaluation.max_examples,
                "loss_bound": evaluation.loss_bound,
                "accuracy_gap": gap,
                "cohorts": per_cohort,
            }
            claim = self._claim()
            self.summary = {
                **self.summary,
                "privacy": claim,
                "epsilon": claim["epsilon"],
                "client_evaluation": self.client_evaluation,
                # a copy: the summary's cohorts later gain train_loss, which DP does not cover
                **({} if evaluation.server else {"cohorts": {k: dict(v) for k, v in per_cohort.items()}}),
            }
            public["epsilon"] = self.summary["epsilon"]
            self.public_columns.update(public)
            row.update(public)
            row.update(internal)
            if self.simulation:
                self._name_round_diagnostics(row)
        return row

    def broadcast(self) -> Broadcast:
        """The policy's public parameters of the coming round (for example C_t)."""
        return self.rounds.broadcast()

    def release_counts(self, round_number: int, sums: RoundSums) -> np.ndarray:
        """The first exchange of a counts-first round (:attr:`Policy.counts_first`): release the
        noisy counts of ``sums``' reports; the next ``broadcast()`` carries the bounds they set."""
        with interrupts_deferred():  # the release and its accounting move together
            return self.rounds.release_counts(round_number, sums)

    def finish_round(
        self, round_number: int, sums: RoundSums, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Release the round (noise, model step, state, accountant), evaluate on schedule, and
        return the round's row."""
        with interrupts_deferred():  # the model, state, accountant, summary and rows move together
            released = self.rounds.release(
                round_number, keep_one_error(sums, self.config.training.clipping_error)
            )
            overall: dict[str, float] = {}
            per_cohort: dict[str, dict[str, float]] = {}
            epsilon = math.nan
            if self._reports(round_number):
                overall, per_cohort = self._evaluate()
                epsilon = self.summary["epsilon"]
            public, internal = _round_row(
                round_number, released, sums, epsilon, overall, per_cohort, self.task.cohort_names
            )
            if self.simulation and sums.num_reports > 0 and internal["nonfinite_updates"] == sums.num_reports:
                self.dropped_rounds.append(round_number)
            self.public_columns.update(public)
            if self.last_epoch is not None and self.last_epoch.wants(round_number, self.rounds_to_run):
                self.last_epoch.add_norms(sums.diagnostics.norm_before, sums.diagnostics.sampled)
                if self._noted_batch is not None and self._noted_batch[0] == round_number:
                    _, losses, update_sums = self._noted_batch
                    self.last_epoch.add(*losses)
                    self.last_epoch.add_batch_updates(*update_sums)
            self._noted_batch = None
            row = {**public, **internal, **(extra or {})}
            self.rows.append(row)
            if self.simulation:
                self._name_round_diagnostics(row)
            self.evaluation_due = round_number if self.evaluates_clients(round_number) else None
        return row

    @property
    def between_releases(self) -> bool:
        """Whether the last round is part released: its counts without its updates (a
        counts-first policy), or its updates without the clients' evaluation that follows them.
        No checkpoint is written then (:meth:`snapshot`): the one before the round stands."""
        return self.rounds.pending is not None or self.evaluation_due is not None

    def finish(self, interrupted: bool = False, error: BaseException | None = None) -> RunResult:
        """The result, with the budget message when the budget cut the run short.

        The summary describes the model after the last completed round, evaluated here if that
        round was not a reporting round (a run stopped early, ``interrupted`` or by an ``error``),
        and its ``status`` says ``finished``, ``interrupted`` (Ctrl-C, SIGTERM) or ``failed``
        (an ``error`` stopped it: a file that could not be written, a model that is not finite;
        ``summary["error"]`` says which, in one line).
        """
        if self.summary.get("rounds_completed") != self.rounds_completed:
            self._evaluate()
        self._add_group_metrics()
        if self.config.training.train_loss:
            self._add_train_losses()
        budget_cut = self.rounds_to_run < self.config.training.rounds
        if budget_cut and self.rounds_completed >= self.rounds_to_run:
            self.stop_reason = self.plan.budget_message(self.rounds_completed, self.rounds_released_again)
        self.summary["stopped_early"] = self.stop_reason
        if self.dropped_rounds:
            self.summary["flags"] = [dropped_rounds_flag(self.dropped_rounds, self.rounds_completed)]
            self._not_covered("flags (the rounds in which every sampled client's update was not finite)")
        if error is not None and not isinstance(error, KeyboardInterrupt | SystemExit):
            self.summary["status"] = "failed"
            self.summary["error"] = one_line(error)
        else:
            self.summary["status"] = "interrupted" if interrupted or error is not None else "finished"
        return self.result

    @property
    def status(self) -> str:
        return str(self.summary["status"])

    def _reports(self, round_number: int) -> bool:
        """Whether this round is evaluated and gets ε in its row: after every k-th round and the
        last (``training.eval_every``; k grows further for runs of more than EPSILON_ROWS rounds,
        :meth:`PrivacyPlan.report_every`, because each accountant call costs 0.01-0.2 s)."""
        every = self.plan.report_every(self.rounds_to_run, self.config.training.eval_every)
        return round_number % every == 0 or round_number >= self.rounds_to_run

    def _evaluate(self) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """Evaluate the current model per cohort and refresh the summary (ε included); the
        summary then describes ``evaluated_model``."""
        overall, per_cohort = self.rounds.evaluate()
        self.summary = self._summary(overall, per_cohort)
        self.evaluated_model = self.model
        return overall, per_cohort

    def _add_group_metrics(self) -> None:
        """Group-fairness metrics of the evaluated model (TPR, FPR and selection rate per cohort;
        demographic-parity and equalized-odds differences) into the summary, where the task
        gives them (``group_metrics``: binary tasks whose cohorts partition the test set). Once a
        run, at its end: Fairlearn takes about 0.15 s a call, too slow for every round."""
        group_metrics = getattr(self.task, "group_metrics", None)
        if not self.config.evaluation.server:  # the server's test set is not used
            group_metrics = None
        found = group_metrics(self.evaluated_model) if group_metrics is not None else None
        if found is None:
            return
        overall, per_cohort = found
        self.summary["overall"] = {**self.summary["overall"], **overall}
        cohorts = self.summary["cohorts"]
        for name, values in per_cohort.items():
            cohorts[name] = {**cohorts.get(name, {}), **values}

    def _add_train_losses(self) -> None:
        """Each cohort's mean training loss (``training.train_loss``) as ``train_loss`` beside its
        test metrics: under the evaluated model, or over the last epoch's batches
        (``"last-epoch"``, ``"last-epoch-examples"``; then also its mean update norm before
        clipping, ``train_update_norm``, and the mean norm of its batch mean update,
        ``train_mean_update_norm``). Simulation-only diagnostics of
        the clients' data, which the summary names as not covered by DP (``not_covered_by_dp``)."""
        cohorts = self.summary["cohorts"]
        if self.last_epoch is not None:
            means, norms = self.last_epoch.losses(), self.last_epoch.update_norms()
            losses = {name: float(means[k]) for k, name in enumerate(self.task.cohort_names)}
            for k, name in enumerate(self.task.cohort_names):
                cohorts[name] = {**cohorts.get(name, {}), "train_update_norm": float(norms[k])}
            self.summary["train_loss_rounds"] = self.last_epoch.rounds
            self._not_covered("cohorts.*.train_update_norm (the clients' updates before clipping)")
            batch_means = self.last_epoch.mean_update_norms()
            for k, name in enumerate(self.task.cohort_names):
                cohorts[name]["train_mean_update_norm"] = float(batch_means[k])
            self._not_covered("cohorts.*.train_mean_update_norm (the clients' updates before clipping)")
        else:
            limit = self.config.training.train_loss_limit
            losses = self.task.train_losses(self.evaluated_model, limit=limit)
        for name, value in losses.items():
            cohorts[name] = {**cohorts.get(name, {}), "train_loss": value}
        self._not_covered("cohorts.*.train_loss (the clients' training examples)")

    def _name_round_diagnostics(self, row: dict[str, Any]) -> None:
        """Name the columns of a simulation's ``rounds.csv`` that DP does not cover -- every column
        outside :attr:`public_columns`: exact counts and clipped fractions, the clients' norms
        before and after clipping, exact evaluations, what the executor adds -- in one entry of
        the summary's ``not_covered_by_dp`` (:data:`ROUND_DIAGNOSTICS`), kept up to date as
        columns appear. A ServerApp writes these columns to its server-internal folder instead
        (:func:`fairclip.server.outputs.write_server_run`)."""
        columns = set(row) - self.public_columns
        if columns <= self._round_diagnostics:
            return
        self._round_diagnostics |= columns
        later = [e for e in self.summary.get("not_covered_by_dp", []) if not e.startswith(ROUND_DIAGNOSTICS)]
        self.summary["not_covered_by_dp"] = [*self._round_diagnostics_named(), *later]

    def _round_diagnostics_named(self) -> list[str]:
        """The summary's first ``not_covered_by_dp`` entry (none before a round has finished, and
        none outside a simulation): the columns of ``rounds.csv`` that DP does not cover."""
        if not (self.simulation and self._round_diagnostics):
            return []
        return [ROUND_DIAGNOSTICS + ", ".join(sorted(self._round_diagnostics))]

    def _not_covered(self, entry: str) -> None:
        """Name ``entry``, a summary value computed from the clients' data without noise (a
        simulation's diagnostic), in the summary's ``not_covered_by_dp``."""
        named = self.summary.get("not_covered_by_dp", [])
        if entry not in named:
            self.summary["not_covered_by_dp"] = [*named, entry]

    def _claim(self) -> dict[str, Any]:
        """The privacy claim of the rounds that ran: ε from the accountant that was fed each
        round's DP event, with the noise those rounds released (the planned noise before the
        first)."""
        accountant, plan = self.rounds.accountant, self.plan
        if self.rounds_completed == self.rounds_to_run:
            self._final_claim.result()  # the background computation of this very ε
        event = self.rounds.last_event or DPEvent.planned(plan.noise, plan.releases_reports)
        mechanism_epsilon = accountant.get_epsilon(plan.delta)
        claimed = not (self.not_private or self.couples_clients)
        claim = PrivacyClaim(
            epsilon=mechanism_epsilon if claimed else math.inf,
            delta=plan.delta,
            accountant=accountant.mechanism,
            sample_rate=plan.sample_rate,
            rounds=accountant.rounds - self.evaluation_releases,
            noise_multiplier=event.noise_multiplier,
            count_noise_multiplier=event.report_noise_multiplier,
            effective_noise_multiplier=event.effective_noise_multiplier,
        ).as_dict()
        if self.rounds_released_again:
            claim["rounds_released_again"] = self.rounds_released_again
        if self.config.evaluation.clients:  # each a step of the same accountant (module docstring)
            claim["evaluation_releases"] = self.evaluation_releases
            claim["evaluation_noise_multiplier"] = self.config.evaluation.noise_multiplier
        if self.policy.noises_below_sensitivity and accountant.history:
            # each round ran with its own multiplier (the ones above are the last round's)
            claim["noise_multiplier_varies"] = True
            claim["smallest_effective_noise_multiplier"] = min(sigma for sigma, _, _ in accountant.history)
            claim["epsilon_note"] = REALIZED_EPSILON_NOTE
        if self.config.privacy.secure_aggregation:
            from fairclip.server.secure_aggregation import summary_of

            claim["secure_aggregation"] = summary_of(self.config, self.policy, self.rounds.model.shape[0])
        if not claimed:
            claim.update(
                guarantee=False,
                not_private=NOT_PRIVATE_NOTE if self.not_private else COUPLED_CLIENTS_NOTE,
                mechanism_epsilon=json_number(mechanism_epsilon),
            )
        return claim

    def _summary(self, overall, per_cohort) -> dict[str, Any]:
        config, plan = self.config, self.plan
        claim = self._claim()
        return {
            "status": "running",
            "scenario": config.scenario.name,
            "policy": policy_name(config.policy.name),
            # the old name of "policy", kept for readers of summaries
            "strategy": policy_name(config.policy.name),
            "seed": config.seed,
            "rounds_completed": self.rounds_completed,
            "epsilon": claim["epsilon"],
            "delta": plan.delta,
            "privacy": claim,
            "privacy_budget": plan.budget,
            "noise_source": self.noise_source,
            "final_clip_bound": json_number(self.rounds.clip_bound),
            "cohorts": per_cohort if config.evaluation.server else self._client_cohorts(),
            "overall": overall,
            **(
                {"evaluation": _evaluated_by(config), "client_evaluation": self.client_evaluation}
                if config.evaluation.clients
                else {}
            ),
            **self.task.summary(self.model),
            **({"not_covered_by_dp": named} if (named := self._round_diagnostics_named()) else {}),
            "config": config.as_dict(),
            "provenance": self._provenance(),
        }

    def _client_cohorts(self) -> dict[str, dict[str, float]]:
        """The per-cohort block of a run without the server's test set: the last client
        evaluation's noisy metrics (none before the first)."""
        return dict(self.client_evaluation["cohorts"]) if self.client_evaluation else {}


def _no_server_test_set(model: np.ndarray) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """The evaluator of a run whose server does not evaluate (``evaluation.server = false``)."""
    return {}, {}


def _evaluated_by(config: RunConfig) -> str:
    """Who evaluated the model the summary describes, in words (a run with client evaluation)."""
    if not config.evaluation.server:
        return "clients (DP)"
    return "server test set; clients (DP) in client_evaluation"


REALIZED_EPSILON_NOTE = (
    "each round's noise multiplier was chosen from counts released during the run: epsilon is the "
    "accountant's reading of the multipliers that ran (an odometer), not a guarantee fixed before "
    "the run, which only the smallest multiplier the policy can reach would give"
)
"""What the privacy claim of a run whose multipliers varied with its releases says of its ε."""

NOT_PRIVATE_NOTE = (
    "client sampling and DP noise followed the configuration's seed (not-private run): anyone who "
    "knows the seed can subtract the noise, so no privacy is claimed; mechanism_epsilon is the "
    "epsilon of the same mechanism with secret randomness"
)
"""What the privacy claim of a not-private run says instead of an ε (:class:`Run`)."""

COUPLED_CLIENTS_NOTE = (
    "training.objective = fairlens: each example's clipped gradient depends on the whole batch "
    "through FairLens's regularisers, so adding or removing one example changes every contribution "
    "and the sum's sensitivity is not the bound its noise uses; no privacy is claimed. "
    "mechanism_epsilon is the epsilon DP-SGD's accounting gives the same noise, as seed 003 reports it"
)
"""What the privacy claim of a run whose clients' updates depend on each other says instead of an
ε (:attr:`Run.couples_clients`)."""


def dropped_rounds_flag(rounds: list[int], completed: int) -> str:
    """The summary's flag of a simulation in which every sampled client's update was not finite
    in ``rounds``: those rounds released noise alone, and the model learnt nothing from them."""
    return (
        f"every sampled client's update was not finite (all dropped) in {len(rounds)} of {completed} "
        f"rounds, first round {rounds[0]}: those rounds released noise alone, the model did not learn "
        "from them"
    )


ROUND_DIAGNOSTICS = "rounds.csv columns (exact, from the clients and their sampling): "
"""How the summary's ``not_covered_by_dp`` entry that names a simulation's internal ``rounds.csv``
columns begins (:meth:`Run._name_round_diagnostics`)."""

NOISY_REPORT_COLUMNS = 16
"""A released noisy report sum of at most this many coordinates (the noisy counts of every
count-releasing policy) is written to the round's row as ``noisy_report_<j>``."""


def _round_row(
    round_number, server: ServerRound, sums: RoundSums, epsilon: float, overall, per_cohort, cohort_names
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(public, internal) values of one round.

    *Public*: what DP covers or what is public anyway -- the bound, the noise, ε, the policy's
    public state, the noisy report sums, and the server's evaluation of the released model on
    its own test data. *Internal*: exact counts and the simulation-only diagnostics, which only
    a trusted server (or a simulation) may keep.
    """
    public: dict[str, Any] = {
        "round": round_number,
        "clip_bound": server.clip_bound,
        "noise_std": server.noise_std,
        "sensitivity": server.sensitivity,
        "epsilon": epsilon,
        "server_lr_factor": server.server_lr_factor,
        **server.info,
    }
    if server.noisy_reports is not None and server.noisy_reports.size <= NOISY_REPORT_COLUMNS:
        for index, value in enumerate(server.noisy_reports):
            public[f"noisy_report_{index}"] = float(value)
    public.update(overall)
    diagnostics = sums.diagnostics
    internal: dict[str, Any] = {
        "clipped_fraction": float(diagnostics.exceeded.sum() / max(sums.num_reports, 1)),
        "sampled_clients": sums.num_reports,
        "nonfinite_updates": _count(diagnostics.nonfinite.sum()),
    }
    for index, name in enumerate(cohort_names):
        count = diagnostics.sampled[index]
        for diagnostic in CLIENT_DIAGNOSTICS:  # the count itself, or the mean over the cohort's clients
            if diagnostic.column is not None:
                value = getattr(diagnostics, diagnostic.name)[index]
                column = f"{name}/{diagnostic.column}"
                internal[column] = _count(value) if diagnostic.kind == "count" else _ratio(value, count)
        internal[f"{name}/median_norm"] = diagnostics.median_norm(index)
        if diagnostics.unclipped_sums is not None:
            internal[f"{name}/direction_cosine"] = diagnostics.direction_cosine(index)
            internal[f"{name}/magnitude_ratio"] = diagnostics.magnitude_ratio(index)
        for metric, value in per_cohort.get(name, {}).items():
            public[f"{name}/{metric}"] = value
    return public, internal


def _count(total: float) -> int | float:
    """A count as an integer; NaN where the server does not know it (no diagnostics sent)."""
    return int(total) if math.isfinite(total) else math.nan


def _ratio(total: float, count: float) -> float:
    return float(total / count) if count > 0 else math.nan
