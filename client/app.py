"""The Flower ``ClientApp`` of fairclip (Flower 1.41 Message API).

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
Training and clipping are the very functions the Ray engine calls (the scenario's
``local_updates`` and :func:`fairclip.client.contributions.contribute`); no policy logic lives
here. Only where the run configuration enables ``simulation-diagnostics`` does a client that
trains on its partition of a simulated scenario also send the simulation-only diagnostics (true
clipping indicator, update norms); a client with its own ``data-path`` never does. The node's
cohort leaves it only where the policy needs it (``per-cohort``, ``reweight``).

The app is a composition root: it reads the scenario through :mod:`fairclip.sims` (the only
``client/`` module that does).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fairclip.client.contributions import contribute
from fairclip.client.flower_logging import drop_opacus_root_handler
from fairclip.client.protocol import identity_content, read_train, reply_content
from fairclip.strategies import Policy, build_policy

app = ClientApp()
drop_opacus_root_handler()  # else Flower prints every line twice


@dataclass
class LocalClient:
    """This node's client: its id, cohort, the scenario's task and the policy."""

    client_id: int
    num_clients: int
    cohort: int
    num_cohorts: int
    task: object
    policy: Policy
    simulated: bool
    """Whether replies carry the simulation-only diagnostics (enabled, and a simulated partition)."""


_CLIENTS: dict[tuple[int, int], LocalClient] = {}
_SCENARIOS: dict[int, tuple] = {}
"""Per run: its resolved configuration and scenario task, shared by every node that a process
serves (Flower's simulation runtime runs many nodes' ClientApps in one worker)."""


def local_client(context: Context) -> LocalClient:
    """This node's client, built once per run, node and process."""
    key = (context.run_id, context.node_id)
    if key not in _CLIENTS:
        if any(run_id != context.run_id for run_id, _ in _CLIENTS):
            _CLIENTS.clear()
            _SCENARIOS.clear()
        _CLIENTS[key] = _build_client(context)
    return _CLIENTS[key]


def _scenario(context: Context, private: bool):
    """(run, task) of this run; ``private`` builds a task of the node's own (it will be changed)."""
    from fairclip.sims.engine import build_task
    from fairclip.sims.flower_config import flower_run

    if private or context.run_id not in _SCENARIOS:
        run = flower_run(dict(context.run_config))
        scenario = (run, build_task(run.config, run.data_dir))
        if private:
            return scenario
        _SCENARIOS[context.run_id] = scenario
    return _SCENARIOS[context.run_id]


def _build_client(context: Context) -> LocalClient:
    node = dict(context.node_config)
    data_path = str(node.get("data-path", ""))
    run, task = _scenario(context, private=bool(data_path))
    config = run.config
    if "partition-id" not in node or "num-partitions" not in node:
        raise ValueError("node config needs partition-id and num-partitions (flower-supernode --node-config)")
    client_id, num_partitions = int(node["partition-id"]), int(node["num-partitions"])
    if num_partitions != config.federation.num_clients:
        raise ValueError(
            f"num-partitions={num_partitions} but federation.num_clients={config.federation.num_clients}"
        )
    if not 0 <= client_id < num_partitions:
        raise ValueError(f"partition-id={client_id} outside 0..{num_partitions - 1}")
    cohort = int(task.client_cohorts[client_id])
    if data_path:
        cohort = _use_data_file(task, client_id, Path(data_path), str(node.get("cohort", "")))
    policy = build_policy(config.strategy.name, config.strategy.params, num_cohorts=len(task.cohort_names))
    return LocalClient(
        client_id=client_id,
        num_clients=num_partitions,
        cohort=cohort,
        num_cohorts=len(task.cohort_names),
        task=task,
        policy=policy,
        simulated=run.simulation_diagnostics and not data_path,
    )


def _use_data_file(task, client_id: int, path: Path, cohort_name: str) -> int:
    if not hasattr(task, "use_local_examples"):
        raise ValueError("data-path is only supported for classification scenarios")
    with np.load(path, allow_pickle=False) as data:
        task.use_local_examples(client_id, data["x"], data["y"])
    if not cohort_name:
        return int(task.client_cohorts[client_id])
    if cohort_name not in task.cohort_names:
        raise ValueError(f"cohort {cohort_name!r} is not a cohort of the scenario ({task.cohort_names})")
    return task.cohort_names.index(cohort_name)


@app.query()
def identify(message: Message, context: Context) -> Message:
    """Tell the server which client this node is (and its cohort, only where the policy needs it).

    A node whose ``num-partitions`` differs from the run's ``federation.num_clients`` answers
    with its partition numbers alone, before building anything: the server refuses it, and
    stops at once where every connected node says so (a local simulation of another size)."""
    from fairclip.sims.flower_config import flower_run

    node = dict(context.node_config)
    try:
        partition, partitions = int(node["partition-id"]), int(node["num-partitions"])
    except (KeyError, TypeError, ValueError):  # local_client names what is wrong
        partition = partitions = None
    if (
        partitions is not None
        and partitions != flower_run(dict(context.run_config)).config.federation.num_clients
    ):
        return Message(identity_content(partition, partitions, None), reply_to=message)
    client = local_client(context)
    cohort = client.cohort if client.policy.needs_cohorts else None
    return Message(identity_content(client.client_id, client.num_clients, cohort), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """Train from θ_t, clip with the policy's client side, reply with Δ̄_i and the report bits."""
    client = local_client(context)
    model, params, round_number = read_train(message.content)
    updates = client.task.local_updates(model, np.array([client.client_id]), round_number)
    sums = contribute(client.policy, params, updates, np.array([client.cohort]), client.num_cohorts)
    return Message(reply_content(sums, with_diagnostics=client.simulated), reply_to=message)
