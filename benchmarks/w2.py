"""W2, sample-level DP-SGD: the tanh CNN of the MNIST reproduction (conv 32 and 16, tanh),
Poisson batches of 256 (expected), per-example clipping at C = 1 and noise σ = 0.8.

* ``fairclip``: fairclip's one-step-client path (one client per example, one local step:
  updates are per-sample gradients, ``fairclip.client.training.one_step_updates``), policy
  ``constant``, driven by fairclip's in-process engine with one worker thread per core
  (``LocalExecutor(workers=cores)``; the same result as one thread).
* ``fairclip-ray``: the same on fairclip's Ray engine (one actor per core), for reference.
* ``fairclip-local``: the same in-process with one thread, for reference.
* ``opacus``: Opacus' own ``PrivacyEngine`` training loop (Poisson sampling, per-example
  clipping and noise; torch's default threads) on the same model, data and batch size.

Examples per second of each contender's fastest of 3 repeats (1 in ``--quick``); the clock
covers the steps and one ε at the end (and fairclip's evaluation of its small test set). The
data is 28×28 synthetic (:mod:`benchmarks.imagetask`; no MNIST download), as many examples as
MNIST's training set (60,000) in the full run.
"""

from __future__ import annotations

import time
from typing import Any

from .common import Measurement, measured, usable_cores

UNIT = "examples/s"
BATCH = 256
NOISE = 0.8
CLIP = 1.0
LR = 0.1


def sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"examples": 2048, "steps": 3, "repeats": 1}
    return {"examples": 60000, "steps": 100, "repeats": 3}


def fastest(runs: list[tuple[float, float, dict[str, Any]]]) -> tuple[float, float, dict[str, Any]]:
    """The fastest of a contender's repeats (seconds, work, details), the one least disturbed by
    other load on a shared machine (as ``timeit`` reports); every repeat's wall time is kept."""
    seconds, work, details = min(runs, key=lambda run: run[0] / run[1])
    details.update(repeats=len(runs), all_wall_s=[run[0] for run in runs])
    return seconds, work, details


def config(quick: bool):
    from .imagetask import image_config, image_run

    size = sizes(quick)
    return image_config(
        image_run(
            num_clients=size["examples"],
            sample_rate=BATCH / size["examples"],
            rounds=size["steps"],
            per_client=1,
            model="tanh-cnn",
            strategy="constant",
            client_lr=1.0,
            test_per_cohort=100,
            # Like Opacus' loop below: no evaluation or ε between steps, one at the end.
            eval_every=size["steps"],
            strategy_params={"initial_bound": CLIP},
            training={"server_lr": LR},
            privacy={"noise_multiplier": NOISE},
        )
    )


def _run_fairclip(quick: bool, engine: str) -> Measurement:
    from .engine import start_ray, timed_rounds
    from .imagetask import build_task, ray_executor

    def body():
        run_config = config(quick)
        task = build_task(run_config)
        assert task.one_step, "the W2 task must take the one-step path"
        workers = 1
        if engine == "ray":
            executor = ray_executor(run_config, start_ray())
        else:
            from fairclip.sims.local_engine import LocalExecutor
            from fairclip.strategies import build_policy

            policy = build_policy(run_config.strategy.name, run_config.strategy.params, num_cohorts=2)
            workers = usable_cores() if engine == "threads" else 1
            executor = LocalExecutor(task, policy, workers=workers)
        runs = []
        for _ in range(sizes(quick)["repeats"]):
            seconds, details = timed_rounds(run_config, task, executor)
            details.update(engine=engine, workers=workers, examples=details["client_updates"], one_step=True)
            runs.append((seconds, details["client_updates"], details))
        return fastest(runs)

    return measured(UNIT, body)


def run_fairclip(quick: bool) -> Measurement:
    return _run_fairclip(quick, "threads")


def run_fairclip_ray(quick: bool) -> Measurement:
    return _run_fairclip(quick, "ray")


def run_fairclip_local(quick: bool) -> Measurement:
    return _run_fairclip(quick, "local")


def run_opacus(quick: bool) -> Measurement:
    import warnings

    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from .imagetask import build_bench_model, synthetic_images

    size = sizes(quick)

    def one_run(dataset) -> tuple[float, float, dict[str, Any]]:
        torch.manual_seed(0)
        model = build_bench_model("tanh-cnn")
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        loader = DataLoader(dataset, batch_size=BATCH)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine = PrivacyEngine(accountant="prv")
            model, optimizer, loader = engine.make_private(
                module=model,
                optimizer=optimizer,
                data_loader=loader,
                noise_multiplier=NOISE,
                max_grad_norm=CLIP,
                poisson_sampling=True,
            )
        loss_function = nn.CrossEntropyLoss()
        examples = steps = 0
        started = time.perf_counter()
        while steps < size["steps"]:
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                if len(y):
                    loss_function(model(x), y).backward()
                optimizer.step()
                examples += len(y)
                steps += 1
                if steps == size["steps"]:
                    break
        epsilon = engine.get_epsilon(1e-5)  # once, inside the clock, as fairclip's ε after its last round
        seconds = time.perf_counter() - started
        details = {
            "steps": steps,
            "examples": examples,
            "threads": torch.get_num_threads(),
            "epsilon": epsilon,
        }
        return seconds, examples, details

    def body():
        from fairclip.client.training import prepare_training

        prepare_training()  # the one-time import fairclip's tasks also do before their rounds
        data = synthetic_images(size["examples"], 1, 1, seed=0)
        dataset = TensorDataset(torch.from_numpy(data["train_x"]), torch.from_numpy(data["train_y"]))
        return fastest([one_run(dataset) for _ in range(size["repeats"])])

    return measured(UNIT, body)


CONTENDERS = {
    "fairclip": run_fairclip,
    "fairclip-ray": run_fairclip_ray,
    "fairclip-local": run_fairclip_local,
    "opacus": run_opacus,
}


__all__ = ["CONTENDERS", "usable_cores"]
