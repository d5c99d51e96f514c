"""The real-data scenarios end to end (short runs) and their partitions, on the benchmark files.

The files are read from ``$FAIRCLIP_DATA`` (default: ``../shared/data`` beside the repository);
a test whose files are absent is skipped with the reason.

The MNIST-type runs use ``scenario.model=cnn`` instead of the scenarios' ``tanh-cnn``: a run
evaluates the 10,000 test images five times (initial summary, then twice per round), which takes
about 5 s per evaluation with the tanh CNN on one thread and under 2 s with the CNN.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fairclip.scenarios.config import load_config
from fairclip.scenarios.data import DATASET_FILES, SHA256
from fairclip.scenarios.data.builtin.adult import ADULT_NUMERIC
from fairclip.scenarios.data.real_data import cohort_test_weights, load, partition
from fairclip.scenarios.tasks import build_task
from fairclip.sims.executors.loop import simulate

DATA_DIR = Path(os.environ.get("FAIRCLIP_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")

DATASET_OF = {"skewed-mnist": "mnist", "fashion-mnist": "fashion-mnist", "adult": "adult", "dutch": "dutch"}
COHORTS = {
    "skewed-mnist": ("majority", "minority"),
    "fashion-mnist": ("majority", "minority"),
    "adult": ("female", "male"),
    "dutch": ("female", "male"),
}
CHEAPER = {
    "skewed-mnist": ["--set", "scenario.model=cnn"],
    "fashion-mnist": ["--set", "scenario.model=cnn"],
}
ORIGINAL_EIGHTS = 5851  # class 8 in the 60,000 MNIST training images


def data_dir_for(scenario: str) -> Path:
    """The data folder, or skip the test when one of the scenario's files is absent."""
    for relative in DATASET_FILES[DATASET_OF[scenario]]:
        if not (DATA_DIR / relative).is_file():
            pytest.skip(f"{DATA_DIR / relative} is absent: set FAIRCLIP_DATA to the benchmark data folder")
    return DATA_DIR


def scenario_spec(scenario: str):
    return load_config(scenario, None, []).scenario


@pytest.mark.parametrize("scenario", list(COHORTS))
def test_short_run_of_real_scenario(cli, tmp_path, scenario):
    data_dir = data_dir_for(scenario)
    out = tmp_path / "run"
    status, _, err = cli(
        "run",
        "--scenario",
        scenario,
        "--data-dir",
        str(data_dir),
        "--set",
        "training.rounds=2",
        "--set",
        "federation.sample_rate=0.01",
        *CHEAPER.get(scenario, []),
        "--out",
        str(out),
    )
    assert status == 0, err
    cohorts = COHORTS[scenario]
    assert tuple(scenario_spec(scenario).cohorts) == cohorts

    rounds = pd.read_csv(out / "rounds.csv")
    assert rounds["round"].tolist() == [1, 2]
    epsilon = rounds["epsilon"].to_numpy()
    assert np.all(np.isfinite(epsilon)) and np.all(epsilon > 0) and epsilon[1] > epsilon[0]
    assert rounds["sampled_clients"].sum() > 0
    for cohort in cohorts:
        for metric in ("accuracy", "loss"):
            values = rounds[f"{cohort}/{metric}"].to_numpy()
            assert np.all(np.isfinite(values)), f"{cohort}/{metric}"
        assert np.all((rounds[f"{cohort}/accuracy"] >= 0) & (rounds[f"{cohort}/accuracy"] <= 1))
    per_cohort = {column.split("/")[0] for column in rounds.columns if "/" in column}
    assert per_cohort == set(cohorts)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["scenario"] == scenario
    assert "preprocessing" not in summary  # nothing outside epsilon by default
    assert summary["rounds_completed"] == 2
    assert list(summary["cohorts"]) == list(cohorts)
    assert math.isfinite(summary["epsilon"]) and summary["epsilon"] == pytest.approx(epsilon[-1])
    for cohort in cohorts:
        assert summary["cohorts"][cohort]["accuracy"] == pytest.approx(rounds[f"{cohort}/accuracy"].iloc[-1])


def test_a_run_scaled_by_the_training_rows_says_the_step_is_outside_epsilon(cli, tmp_path):
    """A user may ask for a paper's preprocessing outside a reproduction: the run's public
    summary then names the step that lies outside its epsilon (issue 64, item 6)."""
    data_dir = data_dir_for("adult")
    out = tmp_path / "run"
    scaled = ["--set", "scenario.feature_scaling=standardize", "--set", "scenario.test_limit=200"]
    small = ["--set", "training.rounds=1", "--set", "federation.sample_rate=0.01"]
    status, stdout, err = cli(
        "run", "--scenario", "adult", "--data-dir", str(data_dir), *scaled, *small, "--out", str(out)
    )
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["preprocessing"] == {
        "outside_epsilon": ["feature scaling by statistics of the training rows (standardize)"]
    }
    assert "outside epsilon (preprocessing): feature scaling by statistics of the training rows" in stdout


# ----- partition semantics on the real data ------------------------------------------------


def test_skewed_mnist_keeps_nine_percent_of_eights_and_gives_the_minority_ninety_percent():
    data_dir = data_dir_for("skewed-mnist")
    spec = scenario_spec("skewed-mnist")
    dataset = load(spec, data_dir, seed=0)
    counts = np.bincount(dataset.y_train, minlength=10)
    eights = int(counts[8])
    # Binomial(5851, 0.09): mean 527, standard deviation 22.
    assert abs(eights - 0.09 * ORIGINAL_EIGHTS) < 90
    assert dataset.num_train == 60_000 - ORIGINAL_EIGHTS + eights
    assert len(dataset.y_test) == 10_000 and np.sum(dataset.y_test == 8) == 974  # test set untouched

    split = partition(spec, dataset, 1000, seed=0)
    assert np.bincount(split.client_cohorts).tolist() == [900, 100]
    held = np.concatenate(split.client_indices)
    assert len(np.unique(held)) == len(held) == dataset.num_train  # every example, once
    minority = split.cohort_indices(1)
    minority_counts = np.bincount(dataset.y_train[minority], minlength=10)
    assert minority_counts[8] / eights == pytest.approx(0.9, abs=0.005)
    # Other classes are split in proportion to the numbers of clients (10 % to the minority).
    others = np.arange(10) != 8
    np.testing.assert_allclose(minority_counts[others] / counts[others], 0.1, atol=0.002)

    weights = cohort_test_weights(spec, dataset, split)
    assert set(weights) == {"majority", "minority"}
    for index, name in enumerate(("majority", "minority")):
        w = weights[name]
        assert np.all(w >= 0) and w.sum() == pytest.approx(1.0)
        # The weighted test set has the class mix of the cohort's training examples.
        train_mix = np.bincount(dataset.y_train[split.cohort_indices(index)], minlength=10)
        train_mix = train_mix / train_mix.sum()
        test_mix = np.bincount(dataset.y_test, weights=w, minlength=10)
        np.testing.assert_allclose(test_mix, train_mix, atol=1e-12)
    # The minority's ~474 eights among ~5,900 examples against the majority's ~53 among ~48,800.
    minority_mix = np.bincount(dataset.y_test, weights=weights["minority"], minlength=10)
    majority_mix = np.bincount(dataset.y_test, weights=weights["majority"], minlength=10)
    assert minority_mix[8] > 0.06 and majority_mix[8] < 0.002


@pytest.mark.parametrize("scenario", ["adult", "dutch"])
def test_attribute_cohorts_hold_only_their_sex(scenario):
    data_dir = data_dir_for(scenario)
    spec = scenario_spec(scenario)
    dataset = load(spec, data_dir, seed=0)
    assert dataset.group_names == ("male", "female")
    # g agrees with the one-hot sex feature, so the cohort called female really holds women.
    sex_column = dataset.feature_names.index("sex=female")
    np.testing.assert_array_equal(dataset.x_train[:, sex_column], dataset.g_train)
    np.testing.assert_array_equal(dataset.x_test[:, sex_column], dataset.g_test)
    if scenario == "adult":  # balanced 14,000 + 14,000, 80/20
        assert (dataset.num_train, dataset.num_test) == (22_400, 5_600)
        assert np.bincount(np.concatenate([dataset.g_train, dataset.g_test])).tolist() == [14_000, 14_000]

    split = partition(spec, dataset, 500, seed=0)
    assert np.bincount(split.client_cohorts).tolist() == [250, 250]
    for index, name in enumerate(COHORTS[scenario]):
        value = dataset.group_names.index(name)
        rows = split.cohort_indices(index)
        assert np.all(dataset.g_train[rows] == value), name
        # ... and every training row of that sex.
        np.testing.assert_array_equal(rows, np.flatnonzero(dataset.g_train == value))
        for client in split.clients_of(index):
            assert len(split.client_indices[client]) > 0

    weights = cohort_test_weights(spec, dataset, split)
    assert set(weights) == set(COHORTS[scenario])
    for name, w in weights.items():
        np.testing.assert_array_equal(w, (dataset.g_test == dataset.group_names.index(name)).astype(float))
    np.testing.assert_array_equal(weights["female"] + weights["male"], np.ones(dataset.num_test))


def _multiset_of_rows(dataset, split: str, left_out: list[int] | None = None) -> Counter:
    """The multiset of a split's rows (features less the columns ``left_out``, label, group)."""
    x, y, g = (getattr(dataset, f"{field}_{split}") for field in ("x", "y", "g"))
    x = np.delete(x, left_out or [], axis=1)
    return Counter(row.tobytes() for row in np.column_stack([x, y, g]))


@pytest.mark.parametrize("scenario", ["adult", "dutch"])
def test_the_test_fraction_sets_the_split_of_the_tabular_datasets(scenario):
    """``scenario.test_fraction`` splits Adult and Dutch alike (Dutch used to ignore it and stay at
    80/20 while a validation split took the fraction given)."""
    data_dir = data_dir_for(scenario)
    spec = scenario_spec(scenario).model_copy(update={"test_fraction": 0.3})
    dataset = load(spec, data_dir, seed=0)
    total = len(dataset.y_train) + len(dataset.y_test)
    assert abs(len(dataset.y_test) - 0.3 * total) <= 1


@pytest.mark.parametrize("scenario", ["adult", "dutch"])
def test_a_split_seed_gives_every_seed_the_same_test_rows(scenario):
    """With ``scenario.split_seed`` the rows are split (and Adult's balancing sample drawn) as that
    seed does, whatever the run's seed; without it each seed splits them anew."""
    data_dir = data_dir_for(scenario)
    spec = scenario_spec(scenario)
    first = load(spec, data_dir, seed=0)
    fixed = spec.model_copy(update={"split_seed": 0})
    for seed in (1, 2):
        same = load(fixed, data_dir, seed=seed)
        for field in ("x_train", "y_train", "g_train", "x_test", "y_test", "g_test"):
            np.testing.assert_array_equal(getattr(same, field), getattr(first, field))
        assert _multiset_of_rows(load(spec, data_dir, seed=seed), "test") != _multiset_of_rows(first, "test")


def test_with_left_out_test_rows_a_validation_run_trains_on_the_final_runs_rows():
    """Seed 000's protocol (zhao-adult, zhao-dutch): the grid runs (``evaluate_on = validation``)
    train on the rows the final runs train on and are compared on the sample's held-out 30 %; the
    final runs test on the rows the sample left out."""
    data_dir = data_dir_for("adult")
    spec = scenario_spec("adult").model_copy(update={"test_rows": "left-out", "test_fraction": 0.3})
    final = load(spec, data_dir, seed=0)
    grid = load(spec.model_copy(update={"evaluate_on": "validation"}), data_dir, seed=0)
    np.testing.assert_array_equal(grid.x_train, final.x_train)
    assert (len(grid.y_train), len(grid.y_test)) == (19_600, 8_400)
    assert len(final.y_test) == 45_222 - 28_000  # the complete rows the sample left out
    women = [int(part.sum()) for part in (grid.g_train, grid.g_test, final.g_test)]
    assert sum(women[:2]) == 14_000 and sum(women) == 14_695  # the held-out women are sampled ones


@pytest.mark.parametrize(("dataset", "every", "dropped"), [("dutch", 59, 50), ("adult", 98, 95)])
def test_scenario_one_hot_reaches_the_loader_and_its_validation_split(dataset, every, dropped):
    """``scenario.one_hot = "drop-first"`` (seed 000's inputs) gives the loaders' narrower layout,
    for the final runs and for a grid run's validation split alike (Adult's numeric columns are
    found again by name there)."""
    data_dir = data_dir_for(dataset)
    spec = scenario_spec(dataset)
    assert load(spec, data_dir, seed=0).x_train.shape[1] == every
    narrow = spec.model_copy(update={"one_hot": "drop-first"})
    for run in (narrow, narrow.model_copy(update={"evaluate_on": "validation"})):
        loaded = load(run, data_dir, seed=0)
        assert loaded.x_train.shape[1] == loaded.x_test.shape[1] == dropped


def test_validation_split_holds_out_training_rows_and_drops_the_test_set():
    data_dir = data_dir_for("adult")
    spec = scenario_spec("adult")
    whole = load(spec, data_dir, seed=1)
    split = load(spec.model_copy(update={"evaluate_on": "validation"}), data_dir, seed=1)
    assert len(split.y_test) == round(spec.test_fraction * len(whole.y_train))
    # the numeric columns are scaled again (the test below), the others are the training rows'
    numeric = [whole.feature_names.index(name) for name in ADULT_NUMERIC]

    assert _multiset_of_rows(split, "train", numeric) + _multiset_of_rows(
        split, "test", numeric
    ) == _multiset_of_rows(whole, "train", numeric)


@pytest.mark.parametrize("scaling", ["standardize", "minmax", "public"])
def test_a_validation_split_scales_adult_by_the_kept_training_rows_alone(scaling):
    """The validation rows feed no preprocessing: Adult's numeric columns are scaled again by the
    statistics of the training rows a grid run keeps (they used to keep the scaling of all the
    training rows, the validation rows among them). The other columns are untouched. The
    public scaling (the default) uses no statistic, so nothing is scaled again."""
    from fairclip.scenarios.data import refit_adult_scaling
    from fairclip.scenarios.data.real_data import validation_split

    data_dir = data_dir_for("adult")
    spec = scenario_spec("adult").model_copy(update={"feature_scaling": scaling})
    whole = load(spec, data_dir, seed=1)
    numeric = [whole.feature_names.index(name) for name in ADULT_NUMERIC]
    others = [i for i in range(whole.x_train.shape[1]) if i not in numeric]
    as_loaded = validation_split(whole, spec.test_fraction, 1)
    refit = validation_split(
        whole, spec.test_fraction, 1, refit=functools.partial(refit_adult_scaling, scaling=scaling)
    )
    loaded = load(spec.model_copy(update={"evaluate_on": "validation"}), data_dir, seed=1)
    for field in ("x_train", "y_train", "g_train", "x_test", "y_test", "g_test"):
        np.testing.assert_array_equal(getattr(loaded, field), getattr(refit, field))
    if scaling == "public":
        np.testing.assert_array_equal(refit.x_train, as_loaded.x_train)
        np.testing.assert_array_equal(refit.x_test, as_loaded.x_test)
        return
    before = as_loaded.x_train[:, numeric].astype(np.float64)
    if scaling == "standardize":
        shift, spread = before.mean(axis=0), before.std(axis=0)
    else:
        shift, spread = before.min(axis=0), before.max(axis=0) - before.min(axis=0)
    for part in ("train", "test"):
        old, new = getattr(as_loaded, f"x_{part}"), getattr(refit, f"x_{part}")
        np.testing.assert_array_equal(new[:, others], old[:, others])
        np.testing.assert_allclose(new[:, numeric], (old[:, numeric] - shift) / spread, atol=1e-5)
    kept = refit.x_train[:, numeric].astype(np.float64)
    if scaling == "standardize":
        np.testing.assert_allclose(kept.mean(axis=0), 0.0, atol=1e-5)
        np.testing.assert_allclose(kept.std(axis=0), 1.0, atol=1e-5)
        assert np.abs(before.mean(axis=0)).max() > 1e-3  # what the validation rows had shifted
    else:
        np.testing.assert_allclose(kept.min(axis=0), 0.0, atol=1e-6)
        np.testing.assert_allclose(kept.max(axis=0), 1.0, atol=1e-6)


@pytest.mark.parametrize("evaluate_on", ["test", "validation"])
def test_test_limit_keeps_a_seeded_subset_of_the_evaluation_rows(evaluate_on):
    data_dir = data_dir_for("adult")
    full = scenario_spec("adult").model_copy(update={"evaluate_on": evaluate_on})
    limited = full.model_copy(update={"test_limit": 300})
    whole, part = load(full, data_dir, seed=1), load(limited, data_dir, seed=1)
    np.testing.assert_array_equal(part.x_train, whole.x_train)  # training rows untouched
    assert len(part.y_test) == len(part.g_test) == 300 < len(whole.y_test)

    # Rows (features, label, group) of the full evaluation set, none twice; the same for a seed.
    assert not _multiset_of_rows(part, "test") - _multiset_of_rows(whole, "test")
    assert part.y_test.mean() != whole.y_test[:300].mean() or part.g_test.mean() != whole.g_test[:300].mean()
    np.testing.assert_array_equal(load(limited, data_dir, seed=1).x_test, part.x_test)
    assert not np.array_equal(load(limited, data_dir, seed=2).x_test, part.x_test)
    everything = full.model_copy(update={"test_limit": len(whole.y_test) + 1})
    np.testing.assert_array_equal(load(everything, data_dir, seed=1).x_test, whole.x_test)


def test_test_limit_is_for_real_datasets(cli, tmp_path):
    status, _, err = cli(
        "run", "--scenario", "demo", "--set", "scenario.test_limit=10", "--out", str(tmp_path)
    )
    assert status == 2
    assert err.strip().count("\n") == 0 and "test_limit applies to real datasets" in err, err


def test_missing_data_file_is_one_line_and_exit_status_2(cli, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    status, _, err = cli("run", "--scenario", "adult", "--data-dir", str(empty), "--out", str(tmp_path / "o"))
    assert status == 2
    lines = err.splitlines()
    assert len(lines) == 1, err  # not even a blank line before it (a transient bar's, off a terminal)
    assert str(empty / "adult" / "adult.data") in lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_every_scenario_file_is_checksummed():
    for scenario, dataset in DATASET_OF.items():
        assert scenario_spec(scenario).dataset == dataset.removeprefix("skewed-")
        assert all(relative in SHA256 for relative in DATASET_FILES[dataset])


def test_dutch_grouped_by_marital_status_trains_the_same_model_as_by_sex():
    """zhao-dutch evaluates seed 000's code's groups (Marital_status code 4 or not): with one
    client per training row and a policy that ignores cohorts, the grouping changes only the
    groups a run reports, never the model it trains."""
    data_dir = data_dir_for("dutch")
    base = [
        "scenario.model=binary-logistic",
        "scenario.partition=per-example",
        "federation.num_clients=48336",
        "federation.sample_rate=0.005",
        "training.rounds=3",
        "training.client_lr=1.0",
        "policy.name=bounded",
        "privacy.noise_multiplier=1.0",
    ]
    marital = [
        "scenario.protected=marital-status",
        'scenario.cohorts={marital-other = {share = 0.94, attribute = "marital-other"}, '
        'marital-4 = {share = 0.06, attribute = "marital-4"}}',
    ]
    results = {}
    for grouping, extra in (("sex", []), ("marital-status", marital)):
        config = load_config("dutch", None, [*base, *extra])
        results[grouping] = simulate(config, build_task(config, data_dir))
    np.testing.assert_array_equal(results["sex"].model, results["marital-status"].model)
    assert set(results["marital-status"].summary["cohorts"]) == {"marital-other", "marital-4"}
    assert set(results["sex"].summary["cohorts"]) == {"female", "male"}
