"""W2, sample-level DP-SGD: Poisson batches of 256 (expected), per-example clipping at C = 1 and
noise σ = 0.8, on three CNNs (:mod:`fairclip.scenarios.models`):

* ``tanh-cnn``: the tanh CNN of the MNIST reproduction (conv 32 and 16, tanh, 2×2 pooling);
* ``esipova-cnn``: seed 003's MNIST CNN as its authors ran it (no pooling, 97,114 parameters);
* ``zhao-cnn``: seed 000's appendix-A.5 CNN (64/64 filters, pooling 3 stride 2, dense 500-500).

Contenders (names of the tanh CNN's; the others' carry the model, ``esipova-cnn/fairclip``). A
model's first four run in one process, in paired repeats (:func:`run_model`):

* ``fairclip``: fairclip's one-step-client path (one client per example, one local step:
  updates are per-sample gradients, clipped from their norms without being formed,
  ``fairclip.scenarios.tasks.ghost``), policy ``constant``, driven by fairclip's in-process executor with
  one worker thread per core (``LocalExecutor(workers=cores)``; the same result as one thread).
* ``fairclip-ray``, ``fairclip-local`` (tanh CNN only, for reference): the same on the Ray executor
  (one actor per core) and in-process with one thread.
* ``opacus``: Opacus' own ``PrivacyEngine`` training loop in its default mode (hooks: Poisson
  sampling, per-sample gradients, clipping and noise; torch's default threads).
* ``opacus-ghost``: the same with ``grad_sample_mode="ghost"`` (ghost clipping: per-sample norms
  without per-sample gradients, then a second backward pass of the re-weighted loss).
* ``sgd``: plain non-private mini-batch SGD on the same model, data and batch size (torch's
  default threads; batches indexed from the tensors, no ``DataLoader``): the physical anchor.

``fairclip bench w2 --device cuda`` runs every contender on the GPU instead: the models and the
data tensors live there, fairclip's in-process executor runs one worker (one GPU), and each clock
stops after ``torch.cuda.synchronize()``. The targets stay this CPU machine's; on a GPU they are
figures for the record.

Examples per second of each contender's fastest repeat (of :data:`PAIRED_REPEATS`; the Ray and
one-thread references: of 3; 1 in ``--quick``); the targets are medians of paired ratios. The clock
covers the steps and, for the private contenders, one ε at the end (and fairclip's evaluation of
its small test set). The data is 28×28 synthetic (:mod:`benchmarks.imagetask`; no MNIST
download), as many examples as MNIST's training set (60,000) in the full run; the larger models
take fewer steps (:data:`STEPS`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .common import Measurement, fastest, measured, usable_cores

UNIT = "examples/s"
BATCH = 256
NOISE = 0.8
CLIP = 1.0
LR = 0.1
MODELS = ("tanh-cnn", "esipova-cnn", "zhao-cnn")
STEPS = {"tanh-cnn": 100, "esipova-cnn": 50, "zhao-cnn": 20}
"""Steps of the full run per model (the larger models' steps take longer)."""

PAIRED_REPEATS = 5
"""Repeats of a model's four contenders in the full run (1 in ``--quick``)."""
WARM_UP_STEPS = 2
"""Steps of each contender's unmeasured first run (its one-time costs: lazy imports, first
kernels, the allocator's growth)."""


def sizes(quick: bool, model: str = "tanh-cnn") -> dict[str, Any]:
    if quick:
        return {"examples": 2048, "steps": 3 if model == "tanh-cnn" else 2, "repeats": 1}
    return {"examples": 60000, "steps": STEPS[model], "repeats": 3}


def contender_name(model: str, contender: str) -> str:
    return contender if model == "tanh-cnn" else f"{model}/{contender}"


def config(quick: bool, model: str = "tanh-cnn", device: str = "cpu", steps: int | None = None):
    """fairclip's run of ``model``: the full or quick size, ``steps`` rounds where given."""
    from .imagetask import image_config, image_run

    size = sizes(quick, model)
    steps = steps or size["steps"]
    return image_config(
        image_run(
            num_clients=size["examples"],
            sample_rate=BATCH / size["examples"],
            rounds=steps,
            per_client=1,
            model=model,
            policy="constant",
            client_lr=1.0,
            test_per_cohort=100,
            # Like Opacus' loop below: no evaluation or ε between steps, one at the end.
            eval_every=steps,
            policy_params={"initial_bound": CLIP},
            training={
                "server_lr": LR,
                # one_step_rows: the device's default; on a GPU (1,024 a call) the whole batch of 256
                "device": device,
            },
            privacy={"noise_multiplier": NOISE},
        )
    )


Run = tuple[float, float, dict[str, Any]]
"""One timed run: (seconds, examples, details)."""
Runner = Callable[[int], Run]
"""Runs a contender once for the given number of steps."""


def _fairclip_runner(quick: bool, model: str, device: str, kind: str = "threads") -> Runner:
    """fairclip's one-step path with its task and executor built once (``kind``: ``threads``,
    one worker thread per core, or one on a GPU; ``local``, one thread; ``ray``, one actor per
    core)."""
    from .imagetask import build_task, ray_executor
    from .timing import start_ray, timed_rounds

    if kind == "ray":
        _ray_is_installed()
    run_config = config(quick, model, device)
    task = build_task(run_config)
    assert task.one_step, "the W2 task must take the one-step path"
    workers = 1
    if kind == "ray":
        executor = ray_executor(run_config, start_ray())
    else:
        # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
        from fairclip.sims.executors.local import LocalExecutor
        from fairclip.strategies import build_policy

        policy = build_policy(run_config.policy.name, run_config.policy.params, num_cohorts=2)
        workers = usable_cores() if kind == "threads" and device == "cpu" else 1
        executor = LocalExecutor(task, policy, workers=workers)

    def run(steps: int) -> Run:
        seconds, details = timed_rounds(config(quick, model, device, steps), task, executor)
        details.update(
            executor=kind,
            workers=workers,
            examples=details["client_updates"],
            one_step=True,
            model=model,
            device=device,
        )
        return seconds, details["client_updates"], details

    return run


def _ray_is_installed() -> None:
    """A machine without Ray (a GPU machine with torch alone, say) reports the Ray contender as
    unavailable rather than failed."""
    import importlib.util

    from .w1 import UnavailableError

    if importlib.util.find_spec("ray") is None:
        raise UnavailableError("ray is not installed here")


def _dataset(quick: bool, model: str, device: str = "cpu"):
    import torch
    from torch.utils.data import TensorDataset

    from .imagetask import synthetic_images

    data = synthetic_images(sizes(quick, model)["examples"], 1, 1, seed=0)
    features, labels = torch.from_numpy(data["train_x"]), torch.from_numpy(data["train_y"])
    return TensorDataset(features.to(device), labels.to(device))


def _synchronize(device: str) -> None:
    """Wait for the GPU's queued work, so that a clock stopped after it covers it."""
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def _opacus_runner(quick: bool, model: str, mode: str, device: str) -> Runner:
    """Opacus' ``PrivacyEngine`` loop (``mode``: ``hooks``, its default, or ``ghost``), a fresh
    model, optimizer and engine each run."""
    import warnings

    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader

    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.scenarios.tasks.training import prepare_training

    from .imagetask import build_bench_model

    prepare_training()  # the one-time import fairclip's tasks also do before their rounds
    dataset = _dataset(quick, model, device)

    def run(steps_wanted: int) -> Run:
        torch.manual_seed(0)
        network = build_bench_model(model).to(device)
        optimizer = torch.optim.SGD(network.parameters(), lr=LR)
        loader = DataLoader(dataset, batch_size=BATCH)
        criterion = nn.CrossEntropyLoss()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine = PrivacyEngine(accountant="prv")
            private = engine.make_private(
                module=network,
                optimizer=optimizer,
                data_loader=loader,
                noise_multiplier=NOISE,
                max_grad_norm=CLIP,
                poisson_sampling=True,
                grad_sample_mode=mode,
                **({"criterion": criterion} if mode == "ghost" else {}),
            )
        if mode == "ghost":
            network, optimizer, criterion, loader = private
        else:
            network, optimizer, loader = private
        examples = steps = 0
        started = time.perf_counter()
        while steps < steps_wanted:
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                if len(y):
                    criterion(network(x), y).backward()
                optimizer.step()
                examples += len(y)
                steps += 1
                if steps == steps_wanted:
                    break
        epsilon = engine.get_epsilon(1e-5)  # once, inside the clock, as fairclip's ε after its last round
        _synchronize(device)
        seconds = time.perf_counter() - started
        details = {
            "steps": steps,
            "examples": examples,
            "threads": torch.get_num_threads(),
            "epsilon": epsilon,
            "model": model,
            "grad_sample_mode": mode,
            "device": device,
        }
        return seconds, examples, details

    return run


def _sgd_runner(quick: bool, model: str, device: str) -> Runner:
    """Plain mini-batch SGD (no clipping, no noise) on batches of :data:`BATCH` drawn by indexing
    the data tensors with a seeded permutation (no ``DataLoader``, whose per-example fetching
    and collation cost more than the tanh CNN's step): the fastest honest non-private step."""
    import torch
    from torch import nn

    from .imagetask import build_bench_model

    features, labels = _dataset(quick, model, device).tensors

    def run(steps_wanted: int) -> Run:
        torch.manual_seed(0)
        network = build_bench_model(model).to(device)
        optimizer = torch.optim.SGD(network.parameters(), lr=LR)
        criterion = nn.CrossEntropyLoss()
        generator = torch.Generator().manual_seed(0)
        examples = steps = 0
        started = time.perf_counter()
        while steps < steps_wanted:
            order = torch.randperm(len(labels), generator=generator).to(device)
            for start in range(0, len(order) - BATCH + 1, BATCH):
                batch = order[start : start + BATCH]
                optimizer.zero_grad(set_to_none=True)
                criterion(network(features[batch]), labels[batch]).backward()
                optimizer.step()
                examples += BATCH
                steps += 1
                if steps == steps_wanted:
                    break
        _synchronize(device)
        seconds = time.perf_counter() - started
        threads = torch.get_num_threads()
        details = {"steps": steps, "examples": examples, "threads": threads, "model": model, "device": device}
        return seconds, examples, details

    return run


PAIRED = ("fairclip", "opacus", "opacus-ghost", "sgd")
"""A model's contenders, timed in paired repeats in one process (:func:`run_model`)."""


def run_model(quick: bool, model: str, device: str = "cpu") -> dict[str, Measurement]:
    """A model's four contenders in one process: each once unmeasured (:data:`WARM_UP_STEPS`),
    then :data:`PAIRED_REPEATS` repeats of all four back to back, in alternating order
    (:func:`benchmarks.common.alternate`). The targets are medians over the repeats of ratios
    within a repeat (fairclip's ``paired`` details), as W4's and W5's are: a contender timed
    minutes after another in a process of its own saw another machine (the tanh CNN's plain SGD
    repeats of 2026-11-26 14:43 took 5.94, 5.87 and 4.32 s). The table shows each contender's
    fastest repeat; its peak memory is the process's resident peak while that contender ran
    (the process holds all four). fairclip runs with one torch thread per worker (its task sets
    that), Opacus and SGD with torch's default threads, as in processes of their own."""
    import statistics

    import torch

    from .common import TreeMemorySampler, alternate, self_peak_rss_bytes

    started = time.perf_counter()
    default_threads = torch.get_num_threads()
    runners = {
        "fairclip": _fairclip_runner(quick, model, device),
        "opacus": _opacus_runner(quick, model, "hooks", device),
        "opacus-ghost": _opacus_runner(quick, model, "ghost", device),
        "sgd": _sgd_runner(quick, model, device),
    }
    steps = sizes(quick, model)["steps"]
    repeats = 1 if quick else PAIRED_REPEATS
    runs: dict[str, list[Run]] = {name: [] for name in PAIRED}
    peaks = dict.fromkeys(PAIRED, 0)
    warm_up_s = {}

    def timed(name: str, steps_wanted: int) -> Run:
        torch.set_num_threads(1 if name == "fairclip" else default_threads)
        with TreeMemorySampler() as sampler:
            run = runners[name](steps_wanted)
        peaks[name] = max(peaks[name], sampler.peak)
        return run

    for name in PAIRED:
        warm_up_s[name] = timed(name, WARM_UP_STEPS)[0]
    for repeat in range(repeats):
        for name in alternate(PAIRED, repeat):
            runs[name].append(timed(name, steps))
    total = time.perf_counter() - started
    speeds = {name: [work / seconds for seconds, work, _ in runs[name]] for name in PAIRED}
    paired = {
        "fairclip/opacus": [f / o for f, o in zip(speeds["fairclip"], speeds["opacus"], strict=True)],
        "fairclip/opacus-ghost": [
            f / g for f, g in zip(speeds["fairclip"], speeds["opacus-ghost"], strict=True)
        ],
        # Against the faster of Opacus' two modes within each pair: the W2 target.
        "fairclip/faster-opacus": [
            f / max(o, g)
            for f, o, g in zip(speeds["fairclip"], speeds["opacus"], speeds["opacus-ghost"], strict=True)
        ],
        "sgd/fairclip": [s / f for s, f in zip(speeds["sgd"], speeds["fairclip"], strict=True)],
    }
    results = {}
    for name in PAIRED:
        seconds, work, details = fastest(runs[name])
        details.update(warm_up_wall_s=warm_up_s[name], paired_repeats=repeats)
        details["total_s_note"] = "total_s: the whole process (the model's four contenders, all repeats)"
        if name == "fairclip":
            details["paired"] = paired
            details["paired_medians"] = {key: statistics.median(values) for key, values in paired.items()}
        peak = peaks[name] or self_peak_rss_bytes()
        results[contender_name(model, name)] = Measurement(
            work / seconds, UNIT, seconds, total, work, peak, details
        )
    return results


def _reference(quick: bool, kind: str, device: str) -> Measurement:
    """fairclip alone in its own process, fastest of 3 (the Ray and one-thread references)."""
    size = sizes(quick)

    def body() -> Run:
        run = _fairclip_runner(quick, "tanh-cnn", device, kind)
        return fastest([run(size["steps"]) for _ in range(size["repeats"])])

    return measured(UNIT, body)


def run_fairclip_ray(quick: bool, device: str = "cpu") -> Measurement:
    return _reference(quick, "ray", device)


def run_fairclip_local(quick: bool, device: str = "cpu") -> Measurement:
    return _reference(quick, "local", device)


CONTENDERS: dict[str, Callable[..., Measurement | dict[str, Measurement]]] = {
    **{model: (lambda quick, device="cpu", m=model: run_model(quick, m, device)) for model in MODELS},
    "fairclip-ray": run_fairclip_ray,
    "fairclip-local": run_fairclip_local,
}
"""The child processes: one per model (its four contenders, paired), and the two references.
Each takes ``(quick, device="cpu")``."""


__all__ = ["CONTENDERS", "MODELS", "PAIRED", "contender_name", "run_model", "usable_cores"]
