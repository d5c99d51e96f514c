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
- every configuration key of docs/design.md, section 5 (``strategy.name``, ``training.rounds``, ``seed``,
  ...) with the default ``""``, which means "keep the scenario's value".

So ``flwr run . --run-config "strategy.name='bounded' training.rounds=5"`` and
``fairclip run --scenario S --set strategy.name=bounded --set training.rounds=5`` resolve to the
same configuration.

A run is *seeded* when the run configuration gives a seed -- the ``seed`` key, a ``seed=`` in
``set``, or a top-level ``seed`` in ``config-file`` -- and :attr:`FlowerRun.seed_source` says
which. Then client sampling and (unless ``privacy.secure_noise`` draws it from OpenDP, which
cannot be seeded) the DP noise follow the seed, as in a simulation: for test runs only.
Otherwise they come from operating-system entropy (docs/design.md, section 6); a built-in scenario's own
seed still fixes the data partition, which every node must agree on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairclip.sims.config import (
    RunConfig,
    apply_overrides,
    check_overrides_used,
    scenario_source,
    set_value,
    validate,
)
from fairclip.sims.errors import ConfigError

UNSET = ""
"""Value of a declared configuration key that keeps the scenario's value."""

CONTROL_KEYS = ("scenario", "config-file", "out", "data-dir", "set", "node-wait", "simulation-diagnostics")

DEFAULT_NODE_WAIT_SECONDS = 300.0


@dataclass(frozen=True)
class FlowerRun:
    """What the ``ServerApp`` and ``ClientApp`` read from Flower's run configuration."""

    config: RunConfig
    out: Path
    data_dir: Path | None
    seed_source: str | None
    """Where the run configuration gave the seed, or ``None`` (a built-in scenario's default)."""
    node_wait: float
    simulation_diagnostics: bool = False

    @property
    def seeded(self) -> bool:
        """Whether sampling and (numpy) DP noise follow the configuration's seed."""
        return self.seed_source is not None


def flower_run(run_config: dict[str, Any]) -> FlowerRun:
    """Resolve Flower's flat run configuration into a validated fairclip configuration."""
    config_file = str(run_config.get("config-file", UNSET))
    scenario = str(run_config.get("scenario", UNSET)) or None
    seed_source = None
    if config_file:
        raw = scenario_source(None, Path(config_file))
        if "seed" in raw:
            seed_source = f"config-file {config_file}"
    elif scenario:
        raw = scenario_source(scenario, None)
    else:
        raise ConfigError("the run configuration names neither `scenario` nor `config-file`")
    for key, value in run_config.items():
        if key in CONTROL_KEYS or value == UNSET:
            continue
        raw = set_value(raw, key, value)
        if key == "seed":
            seed_source = "run-config key seed"
    assignments = [part.strip() for part in str(run_config.get("set", UNSET)).split(";") if part.strip()]
    for assignment in assignments:
        if assignment.partition("=")[0].strip() == "seed":
            seed_source = "set"
    raw = apply_overrides(raw, assignments)
    check_overrides_used(
        raw, [key for key, value in run_config.items() if key not in CONTROL_KEYS and value != UNSET]
    )
    diagnostics = run_config.get("simulation-diagnostics", False)
    if not isinstance(diagnostics, bool):
        raise ConfigError(f"simulation-diagnostics must be true or false (got {diagnostics!r})")
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
    return FlowerRun(
        config=config,
        out=Path(str(run_config.get("out", UNSET)) or "runs/flwr"),
        data_dir=Path(data_dir) if data_dir else None,
        seed_source=seed_source,
        node_wait=float(node_wait),
        simulation_diagnostics=diagnostics,
    )
