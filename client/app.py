"""fairclip's Flower ``ClientApp`` (Flower 1.41 Message API), built around a scenario loader.

A node is one client of the federation. Its node configuration says which:

- ``partition-id`` and ``num-partitions``: the node is client ``partition-id`` of the scenario's
  ``num-partitions`` clients (Flower's simulation runtime sets both; give them with
  ``flower-supernode --node-config`` in a deployment). ``num-partitions`` must equal
  ``federation.num_clients``.
- ``data-path`` (optional, deployment): an ``.npz`` file with arrays ``x`` (examples) and ``y``
  (integer labels) that the node trains on instead of its partition of the scenario, and
  ``cohort`` (optional) the name of its cohort.

For each round it trains from the received θ_t with the received public policy parameters and
replies with its clipped update and report bits (:mod:`fairclip.client.protocol`), nothing else.
Training and clipping are the very functions the Ray executor calls (the scenario's
``local_updates`` and :func:`fairclip.client.contributions.contribute`); no policy logic lives
here. Only where the run configuration enables ``simulation-diagnostics`` does a client that
trains on its partition of a simulated scenario also send the simulation-only diagnostics (true
clipping indicator, update norms); a client with its own ``data-path`` never does. The node's
cohort leaves it only where the policy needs it (``per-cohort``, ``reweight``).

:class:`FairclipClient` reads no scenario itself: it is given a ``load_run`` function (run
configuration -> :class:`ClientRun`). :data:`client_app`, the app that ``pyproject.toml`` names,
is the one over fairclip's scenarios (:func:`load_client_run`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from fairclip.client import secure_aggregation
from fairclip.client.flower_logging import drop_opacus_root_handler
from fairclip.client.protocol import (
    evaluation_reply_content,
    identity_content,
    read_evaluate,
    read_exchange,
    read_train,
    reply_content,
)
from fairclip.scenarios.flower_config import flower_run
from fairclip.strategies import Policy, build_policy
from fairclip.strategies.aggregation import Exchange, RoundSums


class ClientTask(Protocol):
    """What a node needs of its scenario's task (``fairclip.scenarios.tasks.Task``)."""

    cohort_names: list[str]
    client_cohorts: np.ndarray

    def local_updates(self, model: np.ndarray, client_ids: np.ndarray, round_number: int) -> np.ndarray: ...


@dataclass(frozen=True)
class ClientRun:
    """A run as a node sees it: its size, policy, whether it sends diagnostics, and its task
    (``task(private)`` builds it; ``private`` asks for a copy of the node's own to change)."""

    num_clients: int
    policy_name: str
    policy_params: dict[str, Any]
    simulation_diagnostics: bool
    task: Callable[[bool], ClientTask]
    secure_aggregation: bool = False
    """Whether the run sums with secure aggregation: then the node answers only its stages
    (:mod:`fairclip.client.secure_aggregation`), never a train message in clear, and never
    tells its cohort."""
    evaluation: tuple[int, float] | None = None
    """(m, L) of ``[evaluation] clients`` (:mod:`fairclip.strategies.evaluation`): the node
    evaluates the released model on at most m of its held-out examples; ``None``: it does not."""


@dataclass
class LocalClient:
    """This node's client: its id, cohort, the scenario's task and the policy."""

    client_id: int
    num_clients: int
    cohort: int
    num_cohorts: int
    task: Any
    policy: Policy
    simulated: bool
    """Whether replies carry the simulation-only diagnostics (enabled, and a simulated partition)."""

    def contribute(self, params: Any, updates: np.ndarray) -> RoundSums:
        """This client's clipped contribution and reports of its one update row (the function the
        Ray executor calls, :func:`fairclip.client.contributions.contribute`)."""
        from fairclip.client.contributions import contribute  # brings torch: see _build_task's docstring

        return contribute(self.policy, params, updates, np.array([self.cohort]), self.num_cohorts)


@dataclass
class _ProcessCache:
    """What a process keeps between messages: runs, tasks and clients by run (and node)."""

    clients: dict[tuple[int, int], LocalClient] = field(default_factory=dict)
    tasks: dict[int, Any] = field(default_factory=dict)
    runs: dict[int, ClientRun] = field(default_factory=dict)


_CACHES: dict[str, _ProcessCache] = {}
"""Per process and per ``load_run``: Flower's simulation runtime ships the ClientApp object to
its Ray workers pickled by value with every message, so a cache held by the object would start
empty each time (and every message rebuild the scenario's task: W1's 1,000 nodes took minutes)."""


class FairclipClient:
    """The handlers of fairclip's ClientApp over runs that ``load_run`` describes.

    A run's task is built once per process and shared by every node that the process serves
    (Flower's simulation runtime runs many nodes' ClientApps in one worker); a node with its own
    data file gets a task of its own. The cache belongs to the process (:data:`_CACHES`, keyed by
    ``load_run``'s import path), not to this object, which may arrive as a fresh copy with every
    message."""

    def __init__(self, load_run: Callable[[dict[str, Any]], ClientRun]) -> None:
        self.load_run = load_run
        self.cache_key = f"{load_run.__module__}.{load_run.__qualname__}"

    @property
    def _cache(self) -> _ProcessCache:
        return _CACHES.setdefault(self.cache_key, _ProcessCache())

    @property
    def _clients(self) -> dict[tuple[int, int], LocalClient]:
        return self._cache.clients

    @property
    def _tasks(self) -> dict[int, Any]:
        return self._cache.tasks

    def app(self) -> ClientApp:
        """A ClientApp that answers *identify* queries and *train* messages."""
        drop_opacus_root_handler()  # else Flower prints every line twice
        app = ClientApp()
        app.query()(self.identify)
        app.train()(self.train)
        app.evaluate()(self.evaluate)
        return app

    def run(self, context: Context) -> ClientRun:
        runs = self._cache.runs
        if context.run_id not in runs:
            runs.clear()
            runs[context.run_id] = self.load_run(dict(context.run_config))
        return runs[context.run_id]

    def local_client(self, context: Context) -> LocalClient:
        """This node's client, built once per run, node and process."""
        key = (context.run_id, context.node_id)
        if key not in self._clients:
            if any(run_id != context.run_id for run_id, _ in self._clients):
                self._clients.clear()
                self._tasks.clear()
            self._clients[key] = self._build_client(context)
        return self._clients[key]

    def _task(self, context: Context, private: bool) -> Any:
        run = self.run(context)
        if private:
            return run.task(True)
        if context.run_id not in self._tasks:
            self._tasks[context.run_id] = run.task(False)
        return self._tasks[context.run_id]

    def _build_client(self, context: Context) -> LocalClient:
        node = dict(context.node_config)
        data_path = str(node.get("data-path", ""))
        run = self.run(context)
        task = self._task(context, private=bool(data_path))
        if "partition-id" not in node or "num-partitions" not in node:
            raise ValueError(
                "node config needs partition-id and num-partitions (flower-supernode --node-config)"
            )
        client_id, num_partitions = int(node["partition-id"]), int(node["num-partitions"])
        if num_partitions != run.num_clients:
            raise ValueError(f"num-partitions={num_partitions} but federation.num_clients={run.num_clients}")
        if not 0 <= client_id < num_partitions:
            raise ValueError(f"partition-id={client_id} outside 0..{num_partitions - 1}")
        cohort = int(task.client_cohorts[client_id])
        if data_path:
            cohort = _use_data_file(task, client_id, Path(data_path), str(node.get("cohort", "")))
        policy = build_policy(run.policy_name, run.policy_params, num_cohorts=len(task.cohort_names))
        return LocalClient(
            client_id=client_id,
            num_clients=num_partitions,
            cohort=cohort,
            num_cohorts=len(task.cohort_names),
            task=task,
            policy=policy,
            simulated=run.simulation_diagnostics and not data_path,
        )

    def identify(self, message: Message, context: Context) -> Message:
        """Tell the server which client this node is (and its cohort, only where the policy needs it).

        A node whose ``num-partitions`` differs from the run's ``federation.num_clients`` answers
        with its partition numbers alone, before building anything: the server refuses it, and
        stops at once where every connected node says so (a local simulation of another size)."""
        node = dict(context.node_config)
        try:
            partition, partitions = int(node["partition-id"]), int(node["num-partitions"])
        except (KeyError, TypeError, ValueError):  # local_client names what is wrong
            partition = partitions = None
        if partitions is not None and partitions != self.run(context).num_clients:
            return Message(identity_content(partition, partitions, None), reply_to=message)
        client = self.local_client(context)
        needs = client.policy.needs_cohorts and not getattr(self.run(context), "secure_aggregation", False)
        cohort = client.cohort if needs else None
        return Message(identity_content(client.client_id, client.num_clients, cohort), reply_to=message)

    def train(self, message: Message, context: Context) -> Message:
        """Train from θ_t, clip with the policy's client side, reply with Δ̄_i and the report bits.

        A counts-first round (:attr:`Policy.counts_first`) asks twice: the first time the
        client trains, keeps its update in the node's state (``context.state``, which Flower
        keeps for the node across messages) and replies with its report bits alone; the second
        time it clips that same update at the bounds it was sent and replies with Δ̄_i alone (a
        node that lost its state trains again: the same update where training is seeded)."""
        if secure_aggregation.is_secure(message):
            return secure_aggregation.answer(message, context, lambda content: self._vector(context, content))
        if getattr(self.run(context), "secure_aggregation", False):
            raise ValueError("this run sums with secure aggregation: no update is sent in clear")
        client = self.local_client(context)
        model, params, round_number = read_train(message.content)
        exchange = read_exchange(message.content)
        updates = held_update(context, round_number) if exchange is Exchange.UPDATES else None
        if updates is None:
            updates = client.task.local_updates(model, np.array([client.client_id]), round_number)
        context.state.pop(HELD_UPDATE, None)
        if exchange is Exchange.COUNTS:
            context.state[HELD_UPDATE] = ArrayRecord({str(round_number): Array(np.asarray(updates[0]))})
        sums = client.contribute(params, updates)
        content = reply_content(sums, with_diagnostics=client.simulated, exchange=exchange)
        return Message(content, reply_to=message)

    def evaluate(self, message: Message, context: Context) -> Message:
        """Evaluate the released model on this client's held-out examples (``[evaluation]
        clients``) and reply with its evaluation vector alone, or its secure sum's stage."""
        if secure_aggregation.is_secure(message):
            return secure_aggregation.answer(
                message, context, lambda content: self._evaluation_vector(context, content)
            )
        if getattr(self.run(context), "secure_aggregation", False):
            raise ValueError("this run sums with secure aggregation: no evaluation is sent in clear")
        return Message(
            evaluation_reply_content(self._evaluation_vector(context, message.content)), reply_to=message
        )

    def _evaluation_vector(self, context: Context, content: Any) -> np.ndarray:
        """This client's evaluation vector of the model in ``content``, in its own cohort's slot
        (a node on its own data file may name another cohort than its partition's)."""
        run = self.run(context)
        if getattr(run, "evaluation", None) is None:
            raise ValueError("this run does not have its clients evaluate the model (evaluation.clients)")
        max_examples, loss_bound = run.evaluation
        client = self.local_client(context)
        model, _round = read_evaluate(content)
        ids = np.array([client.client_id])
        vectors = client.task.evaluation_contributions(model, ids, max_examples, loss_bound)
        slot = np.asarray(vectors[0], dtype=np.float64).reshape(client.num_cohorts, 3).sum(axis=0)
        own = np.zeros(3 * client.num_cohorts)
        own[3 * client.cohort : 3 * client.cohort + 3] = slot
        return own

    def _vector(self, context: Context, content: Any) -> np.ndarray:
        """What this node would send in clear for a train instruction, as one vector: its
        contribution, then its report vector (the secure sum's input)."""
        client = self.local_client(context)
        model, params, round_number = read_train(content)
        updates = client.task.local_updates(model, np.array([client.client_id]), round_number)
        sums = client.contribute(params, updates)
        return np.concatenate([sums.contribution_sum, sums.report_sum])


HELD_UPDATE = "fairclip.held-update"
"""Key in a node's ``context.state`` of its update between the two exchanges of a counts-first
round (one array, named by the round number)."""


def held_update(context: Context, round_number: int) -> np.ndarray | None:
    """The update this node kept from the first exchange of round ``round_number``, one row."""
    record = context.state.get(HELD_UPDATE)
    if record is None or str(round_number) not in record:
        return None
    return np.asarray(record[str(round_number)].numpy(), dtype=np.float64)[None, :]


def _use_data_file(task: Any, client_id: int, path: Path, cohort_name: str) -> int:
    if not hasattr(task, "use_local_examples"):
        raise ValueError("data-path is only supported for classification scenarios")
    with np.load(path, allow_pickle=False) as data:
        task.use_local_examples(client_id, data["x"], data["y"])
    if not cohort_name:
        return int(task.client_cohorts[client_id])
    if cohort_name not in task.cohort_names:
        raise ValueError(f"cohort {cohort_name!r} is not a cohort of the scenario ({task.cohort_names})")
    return task.cohort_names.index(cohort_name)


def _build_task(config: Any, data_dir: Any) -> Any:
    """The run's scenario task, its modules imported here rather than at the top.

    Flower starts a ClientApp process for every message of a deployment, and most stages of a
    secure sum (keys, shares, unmasking) train nothing: the modules that bring torch and pandas
    (a task here, the clipping in :meth:`LocalClient.contribute`) are imported where a message
    needs them, which starts such a process in 1.3 s rather than 3.9 s."""
    from fairclip.scenarios.tasks import build_task

    task = build_task(config, data_dir)
    drop_opacus_root_handler()  # where a task (a user's own) brought Opacus
    return task


def load_client_run(run_config: dict[str, Any]) -> ClientRun:
    """A node's view of a run: the resolved configuration, and its scenario's task on demand."""

    run = flower_run(run_config)
    return ClientRun(
        num_clients=run.config.federation.num_clients,
        policy_name=run.config.policy.name,
        policy_params=dict(run.config.policy.params),
        simulation_diagnostics=run.simulation_diagnostics,
        task=lambda _private: _build_task(run.config, run.data_dir),
        secure_aggregation=run.config.privacy.secure_aggregation,
        evaluation=(run.config.evaluation.max_examples, run.config.evaluation.loss_bound)
        if run.config.evaluation.clients
        else None,
    )


clients = FairclipClient(load_client_run)
"""The handlers of fairclip's own ClientApp."""
client_app = clients.app()
"""fairclip's Flower ``ClientApp``: ``flwr run .`` and real SuperNode deployments."""
