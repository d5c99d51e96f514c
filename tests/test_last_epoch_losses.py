"""``training.train_loss = "last-epoch"``: each cohort's training loss as seed 003's authors take
it (fair-dp's final_loss_per_group), checked by hand against the run's own models and batches,
across a checkpoint, and where it is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fairclip.scenarios.config import load_config
from fairclip.scenarios.data.federated_dataset import FederatedDataset
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.models import load_vector
from fairclip.scenarios.tasks.classification import ClassificationTask
from fairclip.server.checkpoint import Checkpointing
from fairclip.server.last_epoch_losses import LastEpochLosses
from fairclip.server.run import Run
from fairclip.sims.executors.loop import simulate

CLIENTS, RATE, ROUNDS = 60, 0.1, 25
"""One-example clients, Poisson rate q (an epoch: ⌈1/q⌉ = 10 rounds), rounds of the run."""


def _config(*extra: str):
    sets = [
        "scenario.partition=per-example",
        "training.local_epochs=1",
        "training.client_lr=1.0",
        "policy.name=constant",
        "policy.initial_bound=0.5",
        "privacy.noise_multiplier=0.5",
        f"federation.num_clients={CLIENTS}",
        f"federation.sample_rate={RATE}",
        f"training.rounds={ROUNDS}",
        "training.train_loss=last-epoch",
    ]
    return load_config("dutch", None, [*sets, *extra])


def _task(config) -> ClassificationTask:
    """60 one-example clients: cohort 1 holds every sixth, so many batches of 6 hold none."""
    generator = np.random.default_rng(0)
    data = FederatedDataset(
        train_x=generator.normal(size=(CLIENTS, 5)).astype(np.float32),
        train_y=generator.integers(0, 2, CLIENTS),
        client_indices=[np.array([i]) for i in range(CLIENTS)],
        client_cohorts=(np.arange(CLIENTS) % 6 == 0).astype(np.int64),
        test_x=generator.normal(size=(20, 5)).astype(np.float32),
        test_y=generator.integers(0, 2, 20),
        cohort_weights={"many": (np.arange(20) % 2 == 0) * 1.0, "few": (np.arange(20) % 2 == 1) * 1.0},
        num_classes=2,
    )
    return ClassificationTask.from_dataset(data, config.training, config.seed, "logistic")


class _Models:
    """An observer keeping θ after every round (θ_t of round t + 1)."""

    def __init__(self, first: np.ndarray):
        self.after = {0: first.copy()}

    def on_round(self, row, run) -> None:
        self.after[row["round"]] = run.model.copy()

    def on_finish(self, run) -> None:
        return None


def test_the_last_epochs_batch_means_are_averaged_with_absent_cohorts_as_zero():
    config = _config()
    task = _task(config)
    models = _Models(task.initial_model())
    result = simulate(config, task, observers=[models])
    epoch = math.ceil(1 / RATE)
    assert result.summary["train_loss_rounds"] == epoch
    sampler = Run(config, _task(config))  # the sampling is keyed by (seed, round)
    sums, absent = np.zeros(2), 0
    for round_number in range(ROUNDS - epoch + 1, ROUNDS + 1):
        ids = sampler.sample(round_number)
        load_vector(task.evaluation_model, models.after[round_number - 1])
        with torch.no_grad():
            logits = task.evaluation_model(task.train_x[torch.as_tensor(ids)])
            each = nn.functional.cross_entropy(logits, task.train_y[torch.as_tensor(ids)], reduction="none")
        cohorts = task.client_cohorts[ids]
        for k in range(2):
            if (cohorts == k).any():
                sums[k] += float(each[torch.as_tensor(cohorts == k)].double().mean())
            else:
                absent += 1
    assert absent > 0  # the case the authors' estimator counts as 0 is exercised
    expected = sums / epoch
    got = [result.summary["cohorts"][name]["train_loss"] for name in task.cohort_names]
    assert got == pytest.approx(expected.tolist(), rel=1e-9)
    # not the final model's loss over all examples (training.train_loss = true)
    final = _task(config).train_losses(models.after[ROUNDS])
    assert [final[name] for name in task.cohort_names] != pytest.approx(got, rel=1e-6)
    assert result.summary["not_covered_by_dp"] == ["cohorts.*.train_loss (the clients' training examples)"]


def test_a_run_stopped_in_its_last_epoch_continues_with_the_same_losses(tmp_path):
    config = _config()
    uninterrupted = simulate(config, _task(config))

    class Stop:
        def on_round(self, row, run) -> None:
            if row["round"] == ROUNDS - 4:  # inside the last epoch: 6 of its 10 rounds noted
                raise KeyboardInterrupt

        def on_finish(self, run) -> None:
            return None

    path = tmp_path / "checkpoint.pkl"
    with pytest.raises(KeyboardInterrupt):
        simulate(config, _task(config), observers=[Stop()], checkpoint=Checkpointing(path))
    resumed = simulate(config, _task(config), checkpoint=Checkpointing(path))
    for name in ("many", "few"):
        assert (
            resumed.summary["cohorts"][name]["train_loss"]
            == uninterrupted.summary["cohorts"][name]["train_loss"]
        )
    assert resumed.summary["train_loss_rounds"] == math.ceil(1 / RATE)


def test_the_diagnostic_leaves_the_training_as_it_is():
    """Reading the model before each round draws no randomness and changes no step: the final
    model and test metrics equal those of a run that takes the final model's loss instead."""
    last_epoch = simulate(_config(), _task(_config()))
    final_model = simulate(_config("training.train_loss=true"), _task(_config("training.train_loss=true")))
    for name in ("many", "few"):
        for metric in ("accuracy", "loss"):
            assert last_epoch.summary["cohorts"][name][metric] == final_model.summary["cohorts"][name][metric]
    assert "train_loss_rounds" not in final_model.summary


def test_the_last_epoch_is_the_last_ceil_one_over_q_rounds():
    losses = LastEpochLosses(3, sample_rate=256 / 48336)
    assert losses.epoch_rounds == 189 and losses.first_round(3777) == 3777 - 188
    assert not losses.wants(3588, 3777) and losses.wants(3589, 3777)
    assert np.isnan(losses.means()).all()
    losses.add(np.array([1.0, np.nan, 3.0]))
    losses.add(np.array([3.0, 2.0, np.nan]))
    assert losses.means().tolist() == [2.0, 1.0, 1.5]
    short = LastEpochLosses(1, sample_rate=0.01)  # a run shorter than an epoch
    assert short.first_round(20) == 1 and short.wants(1, 20)
    copy = LastEpochLosses(3, 0.5)
    copy.restore(losses.state())
    assert copy.means().tolist() == losses.means().tolist()


def test_a_loss_limit_is_refused_beside_it():
    with pytest.raises(ConfigError, match=r"train_loss_limit applies only with training\.train_loss = true"):
        _config("training.train_loss_limit=10")
    with pytest.raises(ConfigError):
        _config("training.train_loss=first-epoch")
