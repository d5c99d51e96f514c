"""From a Flower run configuration to a fairclip :class:`RunConfig` (``flwr run .``).

Flower only lets ``--run-config`` override keys declared under ``[tool.flwr.app.config]`` in
``pyproject.toml``. fairclip declares there:

- ``scenario`` (a built-in scenario) or ``config-file`` (a TOML file; wins when not empty),
- ``out`` (the folder of ``rounds.csv``, ``summary.json`` and ``model.npy``) and ``data-dir``,
- ``node-wait``: seconds the server waits for ``federation.num_clients`` nodes to connect,
- ``simulation-diagnostics`` (``false``): let clients on simulated partitions send the
  simulation-only diagnostics (true clipping bits, update norms). Off, a client sends its
  contribution and report bits only, and the server drops any reply that carries more. Turn it
  on for Flower's simulation runtime only, never in a deployment,
- ``set``: further ``KEY=VALUE`` assignments separated by ``;`` (exactly what ``--set`` takes),
- every configuration key of docs/design.md, section 5 (``policy.name``, ``training.rounds``, ``seed``,
  ...) with the default ``""``, which means "keep the scenario's value"; ``strategy.*``, the old
  name of ``policy.*``, is declared too and read as ``policy.*`` (giving both is refused).

So ``flwr run . --run-config "policy.name='bounded' training.rounds=5"`` and
``fairclip run --scenario S --set policy.name=bounded --set training.rounds=5`` resolve to the
same configuration.

The configuration's ``seed`` fixes what every node must agree on -- the data partition of a
simulated scenario -- and nothing else: client sampling comes from operating-system entropy and
the DP noise from OpenDP's exact sampler (or, with ``privacy.secure_noise = false``, numpy's
generator on operating-system entropy). The control key ``not-private`` (``false`` unless given)
makes sampling and noise follow ``seed`` as in a simulation, so that a test can compare a Flower
run with the executors number for number. Whoever knows the seed can regenerate the noise and
subtract it, so such a run is not private, and every public output says so (ε is reported as
infinite, docs/design.md, section 6): for tests and debugging only, never a deployment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairclip.scenarios.config import (
    RunConfig,
    apply_overrides,
    canonical_mapping,
    check_overrides_used,
    scenario_source,
    set_value,
    validate,
)
from fairclip.scenarios.errors import ConfigError

UNSET = ""
"""Value of a declared configuration key that keeps the scenario's value."""

CONTROL_KEYS = (
    "scenario",
    "config-file",
    "out",
    "data-dir",
    "set",
    "node-wait",
    "simulation-diagnostics",
    "not-private",
    "node-partitions",
)

DEFAULT_NODE_WAIT_SECONDS = 300.0


@dataclass(frozen=True)
class FlowerRun:
    """What the ``ServerApp`` and ``ClientApp`` read from Flower's run configuration."""

    config: RunConfig
    out: Path
    data_dir: Path | None
    node_wait: float
    simulation_diagnostics: bool = False
    not_private: bool = False
    """Whether sampling and (numpy) DP noise follow the configuration's seed, which makes the run
    not private (module docstring)."""
    node_partitions: dict[int, int] = field(default_factory=dict)
    """``node-partitions``: node id -> partition id of the nodes the operator registered, which no
    other node can claim (:func:`fairclip.server.nodes.identify_nodes`)."""


def flower_run(run_config: dict[str, Any]) -> FlowerRun:
    """Resolve Flower's flat run configuration into a validated fairclip configuration."""
    config_file = str(run_config.get("config-file", UNSET))
    scenario = str(run_config.get("scenario", UNSET)) or None
    if config_file:
        raw = scenario_source(None, Path(config_file))
    elif scenario:
        raw = scenario_source(scenario, None)
    else:
        raise ConfigError("the run configuration names neither `scenario` nor `config-file`")
    given = canonical_mapping(
        {key: value for key, value in run_config.items() if key not in CONTROL_KEYS and value != UNSET},
        "run configuration",
    )
    for key, value in given.items():
        raw = set_value(raw, key, value)
    assignments = [part.strip() for part in str(run_config.get("set", UNSET)).split(";") if part.strip()]
    raw = apply_overrides(raw, assignments)
    check_overrides_used(raw, list(given))
    diagnostics = run_config.get("simulation-diagnostics", False)
    if not isinstance(diagnostics, bool):
        raise ConfigError(f"simulation-diagnostics must be true or false (got {diagnostics!r})")
    not_private = run_config.get("not-private", False)
    if not isinstance(not_private, bool):
        raise ConfigError(f"not-private must be true or false (got {not_private!r})")
    node_partitions = parse_node_partitions(run_config.get("node-partitions", UNSET))
    data_dir = str(run_config.get("data-dir", UNSET))
    node_wait = run_config.get("node-wait", DEFAULT_NODE_WAIT_SECONDS)
    if isinstance(node_wait, bool) or not isinstance(node_wait, int | float) or not node_wait > 0:
        raise ConfigError(f"node-wait must be a number of seconds > 0 (got {node_wait!r})")
    config = validate(raw)
    if config.training.clipping_error != "both":
        raise ConfigError(
            "training.clipping_error is a simulation-only ablation: "
            "a Flower node never sends its unclipped update"
        )
    if config.training.objective == "fairlens":
        raise ConfigError(
            "training.objective = fairlens is simulation-only: its step needs "
            "every sampled client's gradients and predictions, which a Flower node never sees"
        )
    if config.training.objective == "reconstruction":
        raise ConfigError(
            "training.objective = reconstruction runs in simulations only: the Flower apps do not take it yet"
        )
    if config.training.train_loss:
        raise ConfigError(
            "training.train_loss is a simulation-only diagnostic: "
            "the server never sees the nodes' training data"
        )
    if config.privacy.secure_aggregation:
        check_secure_aggregation(config, diagnostics)
    return FlowerRun(
        config=config,
        out=Path(str(run_config.get("out", UNSET)) or "runs/flwr"),
        data_dir=Path(data_dir) if data_dir else None,
        node_wait=float(node_wait),
        simulation_diagnostics=diagnostics,
        not_private=not_private,
        node_partitions=node_partitions,
    )


def parse_node_partitions(value: Any) -> dict[int, int]:
    """``"NODE:PARTITION,NODE:PARTITION"`` (``node-partitions``; "" for none) as a dict, each
    node and partition once; a malformed value is one :class:`ConfigError` line."""
    pairs: dict[int, int] = {}
    for entry in str(value).replace(";", ",").split(","):
        if not entry.strip():
            continue
        node, separator, partition = entry.partition(":")
        try:
            if not separator:
                raise ValueError
            node_id, partition_id = int(node), int(partition)
        except ValueError:
            raise ConfigError(
                f"node-partitions expects NODE:PARTITION,... (node and partition ids; got {entry.strip()!r})"
            ) from None
        if node_id in pairs or partition_id in pairs.values() or partition_id < 0:
            raise ConfigError(f"node-partitions names node {node_id} or partition {partition_id} twice")
        pairs[node_id] = partition_id
    return pairs


def check_secure_aggregation(config: RunConfig, diagnostics: bool) -> None:
    """Refuse, in one :class:`ConfigError` line, what ``privacy.secure_aggregation`` cannot run:
    the ``none`` policy (no finite bound to quantise to), ``simulation-diagnostics`` (per-client
    values in clear), a counts-first policy (two masked exchanges a round: not wired yet), and a
    threshold that no neighbourhood of the federation can reach."""
    from fairclip.strategies import build_policy

    where = "privacy.secure_aggregation"
    if config.policy.name == "none":
        raise ConfigError(f"{where}: policy none has no bound to quantise to and is not private")
    if diagnostics:
        raise ConfigError(f"{where}: simulation-diagnostics sends per-client values in clear; turn it off")
    num_cohorts = len(getattr(config.scenario, "cohorts", None) or {}) or 1
    policy = build_policy(config.policy.name, config.policy.params, num_cohorts=num_cohorts)
    if policy.counts_first:
        raise ConfigError(
            f"{where}: policy {config.policy.name} with same_round = true needs two masked exchanges a "
            "round, which fairclip does not run yet; use same_round = false"
        )
    privacy, clients = config.privacy, config.federation.num_clients
    if privacy.secagg_threshold is not None and privacy.secagg_threshold > clients - 1:
        raise ConfigError(
            f"privacy.secagg_threshold {privacy.secagg_threshold} needs at least "
            f"{privacy.secagg_threshold + 1} clients (federation.num_clients = {clients})"
        )
