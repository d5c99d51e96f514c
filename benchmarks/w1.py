"""W1, cross-device: 1,000 clients × 64 images (1×28×28), ~100 clients per round (Poisson,
q = 0.1), 5 rounds, one local epoch with batch 32, the W1 CNN, policy ``bounded``.

Every fairclip contender evaluates the model (and computes ε) once, after the last round
(``training.eval_every`` = rounds); pfl-research runs without evaluation.

Contenders (client updates per second):

* ``fairclip``: fairclip's Ray executor, one actor per core.
* ``flower``: fairclip's own ServerApp/ClientApp on Flower's simulation runtime (``flwr run``,
  default resources), one SuperNode per client.
* ``floor``: the same local training in a plain single-process, single-thread PyTorch loop
  (FedAvg without clipping, noise or framework).
* ``pfl``: Apple's pfl-research 0.6.0 with one process per core through ``torchrun``
  (:mod:`benchmarks.pfl_w1`); "unavailable: <reason>" where it is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import REPO_ROOT, Measurement, env_importing_fairclip, measured, usable_cores, wait_for_peers

UNIT = "client updates/s"


def sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"num_clients": 40, "per_client": 16, "sample_rate": 0.25, "rounds": 2}
    return {"num_clients": 1000, "per_client": 64, "sample_rate": 0.1, "rounds": 5}


DEMO_POLICY_TABLES = {"adaptive": {"bound_lr": 0.5}, "bounded": {"lower_bound": 0.5, "bound_lr": 0.5}}
"""The ``demo`` scenario's policy settings, which W1 keeps."""


def settings(quick: bool, policy: str = "bounded") -> dict[str, Any]:
    """W1's raw run configuration (:func:`benchmarks.imagetask.image_run`)."""
    from .imagetask import image_run

    size = sizes(quick)
    raw = image_run(
        num_clients=size["num_clients"],
        sample_rate=size["sample_rate"],
        rounds=size["rounds"],
        per_client=size["per_client"],
        model="w1-cnn",
        policy=policy,
        test_per_cohort=50 if quick else 250,
        # Evaluate and account once, after the last round: pfl-research's W1 evaluates never,
        # and per-round evaluation would time the test set, not the federation.
        eval_every=size["rounds"],
    )
    raw["policy"].update(DEMO_POLICY_TABLES)
    return raw


# ----- (a) fairclip's Ray executor -------------------------------------------------------------


def run_fairclip(quick: bool, policy: str = "bounded") -> Measurement:
    from .imagetask import build_task, image_config, ray_executor
    from .timing import start_ray, timed_rounds

    def body():
        cores = start_ray()
        config = image_config(settings(quick, policy))
        task = build_task(config)
        executor = ray_executor(config, cores)
        seconds, details = timed_rounds(config, task, executor)
        details.update(executor="ray", actors=len(executor.actors), policy=policy)
        return seconds, details["client_updates"], details

    return measured(UNIT, body)


# ----- (c) the compute floor -----------------------------------------------------------------


def run_floor(quick: bool) -> Measurement:
    """Plain PyTorch, one process, one thread: train the sampled clients, average, repeat. Images
    and model in the channels-last memory format, as fairclip's local training has them."""
    import torch
    from torch import nn

    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.strategies.randomness import poisson_sample

    from .images import synthetic_images, w1_cnn

    size = sizes(quick)

    def body():
        # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
        from fairclip.scenarios.models import image_layout
        from fairclip.scenarios.tasks.training import prepare_training

        torch.set_num_threads(1)
        prepare_training()  # the one-time import fairclip's tasks also do before their rounds
        data = synthetic_images(size["num_clients"], size["per_client"], 1, seed=0)
        train_x, train_y = torch.from_numpy(data["train_x"]), torch.from_numpy(data["train_y"])
        torch.manual_seed(0)
        model = w1_cnn()
        global_vector = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
        loss_function = nn.CrossEntropyLoss()
        per_client = size["per_client"]
        generator = torch.Generator().manual_seed(0)
        updates = 0
        wait_for_peers()
        started_epoch = time.time()
        started = time.perf_counter()
        for round_number in range(1, size["rounds"] + 1):
            clients = poisson_sample(0, round_number, size["num_clients"], size["sample_rate"])
            total = torch.zeros_like(global_vector)
            for client in clients:
                nn.utils.vector_to_parameters(global_vector, model.parameters())
                x = image_layout(model, train_x[client * per_client : (client + 1) * per_client])
                optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
                y = train_y[client * per_client : (client + 1) * per_client]
                order = torch.randperm(per_client, generator=generator)
                for start in range(0, per_client, 32):
                    batch = order[start : start + 32]
                    optimizer.zero_grad(set_to_none=True)
                    loss_function(model(x[batch]), y[batch]).backward()
                    optimizer.step()
                trained = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                total += trained - global_vector
                updates += 1
            global_vector = global_vector + total / max(len(clients), 1)
        seconds = time.perf_counter() - started
        return (
            seconds,
            updates,
            {
                "rounds": size["rounds"],
                "client_updates": updates,
                "threads": 1,
                # the measured phase on the wall clock, so that W5 can line up two floors run at once
                "phase_epoch_s": [started_epoch, started_epoch + seconds],
            },
        )

    return measured(UNIT, body)


# ----- (b) Flower's simulation runtime ---------------------------------------------------------

PACKAGE = __package__ or "benchmarks"
FLOWER_APP = f'''"""fairclip's ServerApp and ClientApp with the benchmark image scenarios."""

from {PACKAGE} import flower_w1

serverapp = flower_w1.serverapp
clientapp = flower_w1.clientapp
'''


def _flower_project(folder: Path) -> Path:
    """A throw-away Flower project whose apps are fairclip's (with the benchmark image task)."""
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    config = project["tool"]["flwr"]["app"]["config"]
    lines = [
        "[build-system]",
        'requires = ["hatchling"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        'name = "fairclipbench"',
        'version = "0.1.0"',
        "dependencies = []",
        "",
        "[tool.hatch.build.targets.wheel]",
        'packages = ["."]',
        "",
        "[tool.flwr.app]",
        'publisher = "fairclip"',
        "",
        "[tool.flwr.app.components]",
        'serverapp = "fairclipbench_app:serverapp"',
        'clientapp = "fairclipbench_app:clientapp"',
        "",
        "[tool.flwr.app.config]",
    ]

    def flat(table: dict, prefix: str = ""):
        for key, value in table.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    lines += [f"{key} = {json.dumps(value)}" for key, value in flat(config)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text("\n".join(lines) + "\n")
    (folder / "fairclipbench_app.py").write_text(FLOWER_APP)
    return folder


def run_flower(quick: bool) -> Measurement:
    import tomli_w

    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.benchmarks.flower_local import (
        LOCAL_CONNECTION,
        kill_sessions_mentioning,
        local_simulation_env,
        simulation_options,
        write_local_simulation,
    )

    size = sizes(quick)

    def body():
        binaries = Path(sys.executable).parent
        with tempfile.TemporaryDirectory(prefix="fairclip-bench-flwr-") as tmp:
            tmp_path = Path(tmp)
            home = tmp_path / "flwr-home"
            home.mkdir()
            write_local_simulation(home)
            project = _flower_project(tmp_path / "project")
            out = tmp_path / "out"
            config_file = tmp_path / "w1.toml"
            config_file.write_text(tomli_w.dumps(settings(quick)))
            run_config = " ".join(
                [
                    f"config-file={json.dumps(str(config_file))}",
                    f"out={json.dumps(str(out))}",
                    "seed=0",
                    # like for like: fairclip's executor draws numpy's seeded noise, not OpenDP's,
                    # and samples from the seed (a not-private run: a benchmark, not a release)
                    "not-private=true",
                    "privacy.secure_noise=false",
                    "node-wait=600.0",
                ]
            )
            env = local_simulation_env(home, binaries)
            command = [
                str(binaries / "flwr"), "run", str(project), LOCAL_CONNECTION,
                *simulation_options(size["num_clients"]), "--stream",
                "--run-config", run_config,
            ]  # fmt: skip
            started = time.perf_counter()
            try:
                completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
            finally:
                kill_sessions_mentioning(str(home))
            total = time.perf_counter() - started
            log = completed.stdout + completed.stderr
            if os.environ.get("FAIRCLIP_BENCH_FLOWER_LOG"):
                Path(os.environ["FAIRCLIP_BENCH_FLOWER_LOG"]).write_text(log)
            timing_file = out / "bench_timing.json"
            if completed.returncode != 0 or not timing_file.exists():
                raise RuntimeError(f"flwr run failed (status {completed.returncode}): {log[-2000:]}")
            timing = json.loads(timing_file.read_text())
            replies = out / "server-internal" / "replies.csv"
            reasons = replies.read_text().splitlines()[1:4] if replies.exists() else []
        if sum(timing["dropped"]) or not sum(timing["updates"]):
            raise RuntimeError(f"Flower dropped client replies {timing}: {reasons or log[-3000:]}")
        seconds = timing["rounds_end"] - timing["rounds_start"]
        details = {
            "rounds": len(timing["updates"]),
            "client_updates": int(sum(timing["updates"])),
            "flwr_run_s": total,
            "supernodes": size["num_clients"],
            "dropped_replies": int(sum(timing["dropped"])),
            "resources": "Flower defaults",
        }
        return seconds, details["client_updates"], details

    return measured(UNIT, body)


# ----- (d) pfl-research ------------------------------------------------------------------------


def pfl_python() -> tuple[str | None, str]:
    """(python with pfl 0.6.0 importable, reason when there is none)."""
    candidates = [os.environ.get("FAIRCLIP_PFL_PYTHON"), sys.executable, "/tmp/pflvenv/bin/python"]
    tried = []
    for python in candidates:
        if not python or not Path(python).exists() or python in tried:
            continue
        tried.append(python)
        probe = subprocess.run(
            [python, "-c", "import pfl, pfl.model.pytorch, torch; print(pfl.__version__)"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if probe.returncode == 0:
            return python, probe.stdout.strip()
    return None, (
        "pfl-research (pfl[pytorch]==0.6.0) is not installed; run benchmarks/setup_pfl.sh "
        "or point FAIRCLIP_PFL_PYTHON at a python that has it"
    )


def run_pfl(quick: bool) -> Measurement:
    python, info = pfl_python()
    if python is None:
        raise UnavailableError(info)
    size = sizes(quick)
    cores = usable_cores()

    def body():
        with tempfile.TemporaryDirectory(prefix="fairclip-bench-pfl-") as tmp:
            result_file = Path(tmp) / "pfl.json"
            command = [
                python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cores}",
                "-m", f"{PACKAGE}.pfl_w1", "--out", str(result_file),
                "--clients", str(size["num_clients"]), "--per-client", str(size["per_client"]),
                "--sample-rate", str(size["sample_rate"]), "--rounds", str(size["rounds"]),
            ]  # fmt: skip
            env = {**env_importing_fairclip(Path(tmp)), "OMP_NUM_THREADS": "1"}
            completed = subprocess.run(
                command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800
            )
            if completed.returncode != 0 or not result_file.exists():
                log = completed.stdout + completed.stderr
                raise RuntimeError(f"pfl run failed (status {completed.returncode}): {log[-3000:]}")
            result = json.loads(result_file.read_text())
        result.update(processes=cores, pfl_version=info)
        return result["seconds"], result["client_updates"], result

    return measured(UNIT, body)


class UnavailableError(RuntimeError):
    """A contender that cannot run here; the table shows its reason."""


CONTENDERS = {"fairclip": run_fairclip, "flower": run_flower, "floor": run_floor, "pfl": run_pfl}
