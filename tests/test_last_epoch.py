"""``training.train_loss = "last-epoch"`` and ``"last-epoch-examples"``: each cohort's training loss
as seed 003's authors take it (fair-dp's final_loss_per_group) or as seed 004's Table 2 does (each
example once), and its mean update norm before clipping, checked by hand against the run's own
models and batches, across a checkpoint, and where it is refused."""

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
from fairclip.server.checkpoint import Checkpointing, rounds_done
from fairclip.server.last_epoch import LastEpoch
from fairclip.server.run import Run
from fairclip.sims.executors.local import LocalExecutor
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
    task = ClassificationTask.from_dataset(data, config.training, config.seed, "logistic")
    task.cohort_directions = config.training.cohort_directions  # as build_task sets it
    return task


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
    assert result.summary["not_covered_by_dp"][0].startswith("rounds.csv columns")
    assert result.summary["not_covered_by_dp"][1:] == [
        "cohorts.*.train_update_norm (the clients' updates before clipping)",
        "cohorts.*.train_mean_update_norm (the clients' updates before clipping)",
        "cohorts.*.train_loss (the clients' training examples)",
    ]


def test_seed_004s_reading_weights_each_example_once_and_the_norms_are_the_gradients():
    """``"last-epoch-examples"``: each cohort's loss over every example of the last epoch's
    batches, its mean per-example gradient norm before clipping (one-example clients, one step
    at client learning rate 1: the update is minus the gradient) and
    the norm of its mean gradient in each batch averaged over the batches that hold it (seed
    004's "average gradient norm"), all by hand."""
    config = _config("training.train_loss=last-epoch-examples")
    task = _task(config)
    models = _Models(task.initial_model())
    result = simulate(config, task, observers=[models])
    epoch = math.ceil(1 / RATE)
    sampler = Run(config, _task(config))
    loss_sums, norm_sums, counts = np.zeros(2), np.zeros(2), np.zeros(2)
    mean_norms: list[list[float]] = [[], []]
    model = task.evaluation_model
    for round_number in range(ROUNDS - epoch + 1, ROUNDS + 1):
        ids = sampler.sample(round_number)
        load_vector(model, models.after[round_number - 1])
        batch_sums: dict[int, list[np.ndarray]] = {0: [], 1: []}
        for client in ids:
            x, y = task.train_x[int(client)].unsqueeze(0), task.train_y[int(client)].unsqueeze(0)
            model.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.parameters()))
            k = int(task.client_cohorts[int(client)])
            batch_sums[k].append(
                np.concatenate([p.grad.double().numpy().ravel() for p in model.parameters()])
            )
            loss_sums[k] += float(loss.detach())
            norm_sums[k] += norm
            counts[k] += 1
        for k, gradients in batch_sums.items():
            if gradients:
                mean_norms[k].append(float(np.linalg.norm(np.mean(gradients, axis=0))))
    assert counts.min() > 0 and len(mean_norms[1]) < epoch  # some batches hold no "few"
    cohorts = result.summary["cohorts"]
    names = task.cohort_names
    assert [cohorts[name]["train_loss"] for name in names] == pytest.approx(
        (loss_sums / counts).tolist(), rel=1e-5
    )
    assert [cohorts[name]["train_update_norm"] for name in names] == pytest.approx(
        (norm_sums / counts).tolist(), rel=1e-5
    )
    assert [cohorts[name]["train_mean_update_norm"] for name in names] == pytest.approx(
        [np.mean(mean_norms[0]), np.mean(mean_norms[1])], rel=1e-5
    )
    assert cohorts["many"]["train_mean_update_norm"] < cohorts["many"]["train_update_norm"]
    # not the batch-mean reading, whose absent batches count as 0
    batches = simulate(_config(), _task(_config()))
    assert batches.summary["cohorts"]["few"]["train_loss"] < 0.95 * cohorts["few"]["train_loss"]
    assert batches.summary["cohorts"]["few"]["train_update_norm"] == cohorts["few"]["train_update_norm"]
    # the server forms the cohorts' sums itself (above, as weighted sums of per-example gradients
    # it never forms): the same from formed rows, with the directions diagnostics on (whose
    # executor sums them apart), and in seed 003's reading too
    for other in ("training.per_example=materialize", "training.cohort_directions=true"):
        again = _config("training.train_loss=last-epoch-examples", other)
        tracked = simulate(again, _task(again)).summary["cohorts"]
        for name in names:
            assert tracked[name]["train_mean_update_norm"] == pytest.approx(
                cohorts[name]["train_mean_update_norm"], rel=1e-6
            )
        assert batches.summary["cohorts"][name]["train_mean_update_norm"] == pytest.approx(
            cohorts[name]["train_mean_update_norm"], rel=1e-9
        )
    assert result.summary["not_covered_by_dp"][0].startswith("rounds.csv columns")
    assert result.summary["not_covered_by_dp"][1:] == [
        "cohorts.*.train_update_norm (the clients' updates before clipping)",
        "cohorts.*.train_mean_update_norm (the clients' updates before clipping)",
        "cohorts.*.train_loss (the clients' training examples)",
    ]


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
        for value in ("train_loss", "train_update_norm", "train_mean_update_norm"):
            assert resumed.summary["cohorts"][name][value] == uninterrupted.summary["cohorts"][name][value]
    assert resumed.summary["train_loss_rounds"] == math.ceil(1 / RATE)


def test_a_run_stopped_while_a_last_epoch_round_trains_counts_that_round_once(tmp_path):
    """Ctrl-C or SIGTERM lands while a round trains (most of a round's time), after the round's
    batch was measured: the checkpoint written then holds the rounds before it, and so must the
    last epoch's sums, or the resumed run measures that batch a second time."""
    config = _config()
    uninterrupted = simulate(config, _task(config))
    stop = ROUNDS - 4  # inside the last epoch

    class InterruptedRound(LocalExecutor):
        def __call__(self, model, client_ids, round_number, *args):
            if round_number == stop:
                raise KeyboardInterrupt
            return super().__call__(model, client_ids, round_number, *args)

    path = tmp_path / "checkpoint.pkl"
    with pytest.raises(KeyboardInterrupt):
        simulate(config, _task(config), InterruptedRound, checkpoint=Checkpointing(path))
    assert rounds_done(path, config) == stop - 1, "the interrupted round is not in the checkpoint"
    resumed = simulate(config, _task(config), checkpoint=Checkpointing(path))
    assert resumed.summary["train_loss_rounds"] == math.ceil(1 / RATE)  # 11 before the fix
    assert uninterrupted.summary["train_loss_rounds"] == math.ceil(1 / RATE)
    for name in ("many", "few"):
        for value in ("train_loss", "train_update_norm", "train_mean_update_norm"):
            assert resumed.summary["cohorts"][name][value] == uninterrupted.summary["cohorts"][name][value]


@pytest.mark.parametrize("objective", ["cross-entropy", "fairlens"])
def test_the_diagnostic_leaves_the_training_as_it_is(objective):
    """Reading the model and training the batch's updates again before each round of the last
    epoch draws no randomness and changes no step: the final model and test metrics equal those
    of a run that takes the final model's loss instead, under FairLens' batch term too (its
    updates are formed after the round's term)."""
    objective = f"training.objective={objective}"
    last_epoch = simulate(_config(objective), _task(_config(objective)))
    final = _config(objective, "training.train_loss=true")
    final_model = simulate(final, _task(final))
    for name in ("many", "few"):
        for metric in ("accuracy", "loss"):
            assert last_epoch.summary["cohorts"][name][metric] == final_model.summary["cohorts"][name][metric]
    assert "train_loss_rounds" not in final_model.summary


def test_the_last_epoch_is_the_last_ceil_one_over_q_rounds():
    losses = LastEpoch(3, sample_rate=256 / 48336)
    assert losses.epoch_rounds == 189 and losses.first_round(3777) == 3777 - 188
    assert not losses.wants(3588, 3777) and losses.wants(3589, 3777)
    assert np.isnan(losses.losses()).all() and np.isnan(losses.update_norms()).all()
    losses.add(np.array([2.0, 0.0, 6.0]), np.array([2, 0, 2]))  # batch means 1, -, 3
    losses.add(np.array([9.0, 2.0, 0.0]), np.array([3, 1, 0]))  # batch means 3, 2, -
    assert losses.losses().tolist() == [2.0, 1.0, 1.5]
    short = LastEpoch(1, sample_rate=0.01)  # a run shorter than an epoch
    assert short.first_round(20) == 1 and short.wants(1, 20)
    copy = LastEpoch(3, 0.5)
    copy.restore(losses.state())
    assert copy.losses().tolist() == losses.losses().tolist()
    # seed 004's reading: every example once, (2 + 9) / 5, 2 / 1, 6 / 2
    examples = LastEpoch(3, sample_rate=256 / 48336, weighting="last-epoch-examples")
    examples.add(np.array([2.0, 0.0, 6.0]), np.array([2, 0, 2]))
    examples.add(np.array([9.0, 2.0, 0.0]), np.array([3, 1, 0]))
    assert examples.losses().tolist() == [2.2, 2.0, 3.0]
    examples.add_norms(np.array([3.0, 0.0, 1.0]), np.array([2, 0, 1]))
    examples.add_norms(np.array([1.0, 0.0, 2.0]), np.array([2, 0, 1]))
    norms = examples.update_norms()
    assert norms[0] == 1.0 and np.isnan(norms[1]) and norms[2] == 1.5
    with pytest.raises(ValueError, match="weighting"):
        LastEpoch(1, 0.5, weighting="first-epoch")


def test_a_checkpoint_without_norms_leaves_them_unknown_not_partial():
    """A checkpoint written before the norms were kept, inside the last epoch: the norms of
    the rounds it noted are lost, so the run reports NaN, not an average of part of the epoch."""
    old = {"sums": np.array([1.0, 2.0]), "rounds": 3}
    restored = LastEpoch(2, 0.1)
    restored.restore(old)
    restored.add_norms(np.array([2.0, 2.0]), np.array([1, 1]))
    assert np.isnan(restored.update_norms()).all()
    assert restored.losses().tolist() == [1.0 / 3, 2.0 / 3]
    # one written inside the last epoch by a run that kept no cohort sums (before 2026-12-06,
    # without training.cohort_directions): G_k is unknown, not an average of the later rounds
    without_sums = LastEpoch(2, 0.1)
    without_sums.add(np.array([1.0, 2.0]), np.array([1, 1]))
    without_sums.add_norms(np.array([2.0, 2.0]), np.array([1, 1]))
    resumed = LastEpoch(2, 0.1)
    resumed.restore(without_sums.state())
    resumed.add_batch_updates(np.array([[3.0, 4.0], [0.0, 1.0]]), np.array([1, 1]))
    assert np.isnan(resumed.mean_update_norms()).all() and resumed.update_norms().tolist() == [2.0, 2.0]
    kept = LastEpoch(2, 0.1)
    kept.add_batch_updates(np.array([[3.0, 4.0], [0.0, 0.0]]), np.array([2, 0]))
    kept.restore(kept.state())
    assert kept.mean_update_norms()[0] == 2.5 and np.isnan(kept.mean_update_norms()[1])
    before_the_epoch = LastEpoch(2, 0.1)
    before_the_epoch.restore({"sums": np.zeros(2), "rounds": 0})
    before_the_epoch.add_norms(np.array([2.0, 3.0]), np.array([1, 2]))
    assert before_the_epoch.update_norms().tolist() == [2.0, 1.5]


def test_a_cohorts_batch_sum_norm_neither_overflows_nor_underflows():
    """G_k's term ||Σ Δ_i|| takes each cohort's length as the clipping does (``row_norms``):
    ``np.linalg.norm(axis=1)`` gave inf for six entries of 1e300 and 0 for six of 3e-170."""
    epoch = LastEpoch(2, 0.1)
    epoch.add_batch_updates(np.array([[1e300] * 6, [3e-170] * 6]), np.array([1, 2]))
    expected = [math.sqrt(6) * 1e300, math.sqrt(6) * 3e-170 / 2]
    assert epoch.mean_update_norms() == pytest.approx(expected, rel=1e-12)


def test_a_loss_limit_is_refused_beside_it():
    with pytest.raises(ConfigError, match=r"train_loss_limit applies only with training\.train_loss = true"):
        _config("training.train_loss_limit=10")
    with pytest.raises(ConfigError):
        _config("training.train_loss=first-epoch")
