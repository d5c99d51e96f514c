"""Issue 68: what a second round of hostile use broke -- results lost or misreported, errors that
came late, deep or never, memory that grew with the rounds, and a node that could evict
another. Each test here failed before its fix."""

from __future__ import annotations

import json
import os

import pytest

import fairclip
from fairclip.sims.errors import ConfigError
from fairclip.sims.sweep_folder import locked


def test_a_run_folder_in_use_is_refused(cli, tmp_path):
    """Two `fairclip run` on one --out both exited 0 and printed "wrote": the folder held only
    the second run. The second now stops before any work, naming the holder."""
    out = tmp_path / "run"
    with locked(out):
        status, _, err = cli(
            "run", "--scenario", "bimodal-mean", "--set", "training.rounds=2", "--out", str(out)
        )
    assert status == 2 and err.strip() == (
        f"fairclip: error: {out} is in use by another fairclip process (pid {os.getpid()}); wait for it"
    )
    assert not (out / "rounds.csv").exists()
    status, _, err = cli("run", "--scenario", "bimodal-mean", "--set", "training.rounds=2", "--out", str(out))
    assert status == 0, err
    assert (out / "rounds.csv").exists()


def test_a_search_folder_in_use_is_refused(tmp_path):
    out = tmp_path / "search"
    small = {"strategy.name": "bounded", "training.rounds": 2, "privacy.target_epsilon": 2.0}
    with locked(out), pytest.raises(ConfigError, match="is in use by another fairclip process"):
        fairclip.tune("demo", grid={"training.client_lr": [0.1, 0.5]}, overrides=small, seed=3, out=out)
    assert not (out / "tuning.json").exists()
    with locked(out), pytest.raises(ConfigError, match="is in use by another fairclip process"):
        fairclip.tune_curve(
            "demo", strategies=["bounded"], epsilons=[2.0], grid={"training.client_lr": [0.1]},
            overrides={"training.rounds": 2}, out=out, seed=3,
        )  # fmt: skip


def test_a_full_disk_is_refused_before_any_work(cli, tmp_path, monkeypatch):
    """A disk already full used to pass the folder check (an empty file fits) and fail on the first
    write with exit status 1; the check now writes 64 KiB first."""
    import errno

    real_fsync = os.fsync

    def full(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    status, _, err = cli("run", "--scenario", "bimodal-mean", "--out", str(tmp_path / "run"))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert status == 2 and err.strip().splitlines() == [
        f"fairclip: error: output folder {tmp_path / 'run'} cannot be written: No space left on device"
    ]
    assert not (tmp_path / "run").exists()


def test_a_model_that_is_not_finite_stops_the_run_saying_why(cli, tmp_path):
    """A server step that overflows the model used to end "finished" with an infinite model, an
    accuracy and an ε."""
    out = tmp_path / "run"
    status, _, err = cli(
        "run", "--scenario", "bimodal-mean", "--out", str(out), "--set", "strategy.name=none",
        "--set", "training.server_lr=1e308", "--set", "training.rounds=5",
    )  # fmt: skip
    assert status == 1 and len(err.strip().splitlines()) == 1, err
    assert "the model is not finite after the server step" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "not finite" in summary["error"]
    assert summary["rounds_completed"] < 5


def test_a_plug_in_state_that_is_not_finite_stops_the_run():
    from tests.test_policy_guards import Bound, _Hard

    class Diverges(_Hard):
        name = "hostile-diverges"

        def next_state(self, state, estimate, noisy_reports, expected_clients):
            return Bound(float("nan"))

    from fairclip.policies import register
    from fairclip.strategies.errors import PolicyError

    register(Diverges, replace=True)
    with pytest.raises(PolicyError, match="sensitivity nan"):
        fairclip.simulate(
            "bimodal-mean", overrides={"strategy.name": Diverges.name, "training.rounds": 3,
                                       "federation.num_clients": 200},
        )  # fmt: skip


def test_a_run_whose_every_update_is_dropped_says_so(tmp_path):
    """A model whose outputs are NaN: every update is dropped as non-finite, and the run used to
    end "finished" with an untrained model and nothing to say so."""
    import numpy as np
    import torch
    from torch import nn

    class NotANumber(nn.Module):
        def forward(self, x):
            return torch.log(-(x.abs() + 1.0))

    def model(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes), NotANumber())

    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    data = fairclip.FederatedDataset.from_arrays(
        x, (x[:, 0] > 0).astype(np.int64), clients=np.repeat(np.arange(10), 4), cohorts=["a"] * 10,
        test_x=x, test_y=(x[:, 0] > 0).astype(np.int64), test_cohorts=np.array(["a"] * 40),
    )  # fmt: skip
    scenario = fairclip.Scenario("nan-model", dataset=data, model=model, sample_rate=1.0, rounds=3,
                                 settings={"privacy.noise_multiplier": 0.0})  # fmt: skip
    result = fairclip.simulate(scenario, overrides={"strategy.name": "constant"})
    assert result.summary["status"] == "finished"
    (flag,) = result.summary["flags"]
    assert "not finite (all dropped) in 3 of 3 rounds, first round 1" in flag
