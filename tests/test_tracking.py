"""Issue 18, point 18: a run also logs every round to TensorBoard or MLflow, off by default."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest

SHORT = ("--scenario", "demo", "--set", "training.rounds=4", "--set", "federation.num_clients=100")


def _tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_run_logs_every_round_to_tensorboard(cli, tmp_path):
    out, board = tmp_path / "run", tmp_path / "tb"
    status, _, err = cli(
        "run", *SHORT, "--set", "policy.name=bounded", "--out", str(out), "--tensorboard", str(board)
    )
    assert status == 0, err
    rounds = pd.read_csv(out / "rounds.csv")
    logged = _tensorboard_scalars(board / "run")
    for column in ("clip_bound", "noise_std", "minority/accuracy", "majority/median_norm"):
        steps, values = zip(*logged[column], strict=True)
        assert list(steps) == rounds["round"].tolist(), column
        np.testing.assert_allclose(values, rounds[column], rtol=1e-6, err_msg=column)
    summary = json.loads((out / "summary.json").read_text())
    assert logged["final/epsilon"] == [(4, pytest.approx(summary["epsilon"], rel=1e-6))]


def test_run_logs_every_round_to_mlflow(cli, tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    out = tmp_path / "adaptive-run"
    status, _, err = cli(
        "run", *SHORT, "--set", "policy.name=adaptive", "--out", str(out), "--mlflow", "fairclip-test"
    )
    assert status == 0, err
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name("fairclip-test")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "adaptive-run" and run.info.status == "FINISHED"
    assert run.data.params["policy.name"] == "adaptive" and run.data.params["training.rounds"] == "4"
    history = sorted(client.get_metric_history(run.info.run_id, "clip_bound"), key=lambda m: m.step)
    rounds = pd.read_csv(out / "rounds.csv")
    assert [m.step for m in history] == rounds["round"].tolist()
    np.testing.assert_allclose([m.value for m in history], rounds["clip_bound"], rtol=1e-12)


def test_compare_logs_each_run_under_its_key(ray_session, cli, tmp_path):
    board = tmp_path / "tb"
    args = (*SHORT, "--strategies", "adaptive", "--epsilons", "4", "--out", str(tmp_path / "c"))
    status, _, err = cli("compare", *args, "--tensorboard", str(board))
    assert status == 0, err
    assert sorted(path.name for path in board.iterdir()) == [
        "adaptive__eps-4__seed-0",
        "none__eps-none__seed-0",
    ]
    for key in ("adaptive__eps-4__seed-0", "none__eps-none__seed-0"):
        rounds = pd.read_csv(tmp_path / "c" / "runs" / key / "rounds.csv")
        logged = _tensorboard_scalars(board / key)
        np.testing.assert_allclose(
            [v for _, v in logged["majority/accuracy"]], rounds["majority/accuracy"], rtol=1e-6
        )


def test_nothing_is_logged_by_default(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, _, err = cli("run", *SHORT, "--out", str(tmp_path / "run"))
    assert status == 0, err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run"]  # no runs/, mlruns/, mlflow.db


@pytest.mark.parametrize(("option", "package"), [("--tensorboard", "tensorboard"), ("--mlflow", "mlflow")])
def test_a_missing_tracking_package_is_one_line_before_any_work(cli, tmp_path, monkeypatch, option, package):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a)
    )
    status, _, err = cli("run", *SHORT, "--out", str(tmp_path / "run"), option, str(tmp_path / "x"))
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"fairclip: error: {option} needs the {package} package"
    ), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "command", [["run", "--scenario", "bimodal-mean"], ["compare", "--scenario", "bimodal-mean"]]
)
def test_a_tensorboard_folder_that_cannot_be_written_is_one_line_before_any_work(cli, tmp_path, command):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    out = tmp_path / "out"
    status, _, err = cli(*command, "--tensorboard", str(a_file), "--out", str(out))
    assert status == 2 and err.strip().splitlines() == [f"fairclip: error: output folder {a_file} is a file"]
    assert not out.exists()
