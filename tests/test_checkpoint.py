"""A run killed half-way continues from its checkpoint to the very result of a run never stopped
(fairclip.server.checkpoint): the same rows, θ, policy state and ε, for every policy; a checkpoint
of another run, or a broken one, is refused in one line; ε never counts a round twice."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairclip.scenarios.config import load_config
from fairclip.scenarios.errors import ConfigError
from fairclip.scenarios.tasks import build_task
from fairclip.server.checkpoint import (
    CHECKPOINT_FILE,
    Checkpointing,
    read,
    rounds_done,
    share_computed_earlier,
)
from fairclip.server.run import Run
from fairclip.sims.executors.jobs import CANCEL_GRACE_SECONDS
from fairclip.sims.executors.local import LocalExecutor
from fairclip.sims.executors.loop import simulate
from fairclip.strategies.aggregation import Exchange

ROUNDS = 7
POLICY_SETTINGS = {
    "none": ["policy.name=none"],
    "constant": ["policy.name=constant", "policy.initial_bound=0.3"],
    "adaptive": ["policy.name=adaptive"],
    "bounded": ["policy.name=bounded"],
    "soft": ["policy.name=soft"],
    "global-adapt": ["policy.name=global-adapt"],
    "per-cohort": ["policy.name=per-cohort", "policy.initial_bound=0.3"],
    "per-cohort-same-round": ["policy.name=per-cohort", "policy.same_round=true"],
    "online": ["policy.name=online"],
    "adam": ["policy.name=bounded", "training.server_optimizer=adam", "training.server_lr=0.05"],
    "adam-wosm": ["policy.name=bounded", "training.server_optimizer=adam-wosm", "training.server_lr=0.002"],
    "sgd-momentum": ["policy.name=bounded", "training.server_momentum=0.9", "training.server_lr=0.5"],
}
"""Every kind of state a round carries: bounds, counts, the OSO learning-rate factor, and the
server optimizer's moments (Adam's, AdamWOSM's and SGD's momentum, with the bounded policy)."""


def _config(case: str, *extra: str):
    chosen = [*POLICY_SETTINGS[case], f"training.rounds={ROUNDS}", "training.eval_every=3", "seed=3"]
    return load_config("demo", None, [*chosen, *extra])


class _StopAfter:
    """An observer that interrupts the run (as Ctrl-C would) after round ``round_number``."""

    def __init__(self, round_number: int):
        self.round_number = round_number

    def on_round(self, row, run) -> None:
        if row["round"] == self.round_number:
            raise KeyboardInterrupt

    def on_finish(self, run) -> None:
        return None


def _without_provenance(summary: dict) -> dict:
    return {key: value for key, value in summary.items() if key != "provenance"}


def _same_run(resumed, straight) -> None:
    assert pd.DataFrame(resumed.rows).equals(pd.DataFrame(straight.rows))
    np.testing.assert_array_equal(resumed.model, straight.model)
    assert json.dumps(_without_provenance(resumed.summary), sort_keys=True, default=str) == json.dumps(
        _without_provenance(straight.summary), sort_keys=True, default=str
    )
    assert resumed.public_columns == straight.public_columns


_STRAIGHT: dict[str, object] = {}


def _straight(case: str):
    if case not in _STRAIGHT:
        config = _config(case)
        _STRAIGHT[case] = simulate(config, build_task(config))
    return _STRAIGHT[case]


CASES = sorted(POLICY_SETTINGS)


@pytest.mark.parametrize("case", CASES)
def test_a_run_stopped_continues_to_the_same_result_for_every_policy(tmp_path, case):
    _stop_and_continue(tmp_path / CHECKPOINT_FILE, case, stop=1 + 4 * CASES.index(case) % (ROUNDS - 1))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stop=st.integers(1, ROUNDS - 1))
def test_a_run_stopped_after_any_round_continues_to_the_same_result(tmp_path_factory, stop):
    _stop_and_continue(tmp_path_factory.mktemp("checkpoint") / CHECKPOINT_FILE, "per-cohort-same-round", stop)


def _stop_and_continue(path: Path, case: str, stop: int) -> None:
    config = _config(case)
    with pytest.raises(KeyboardInterrupt):
        simulate(config, build_task(config), observers=[_StopAfter(stop)], checkpoint=Checkpointing(path))
    assert rounds_done(path, config) == stop
    seen = []
    resumed = simulate(
        config,
        build_task(config),
        on_round=lambda row: seen.append(row["round"]),
        checkpoint=Checkpointing(path),
    )
    assert seen == list(range(stop + 1, ROUNDS + 1)), "only the rounds after the checkpoint are computed"
    _same_run(resumed, _straight(case))
    assert resumed.summary["privacy"]["rounds"] == ROUNDS
    pieces = resumed.summary["provenance"]["pieces"]
    assert [(p["first_round"], p["last_round"]) for p in pieces] == [(1, stop), (stop + 1, ROUNDS)]
    assert resumed.summary["provenance"]["wall_seconds"] == pytest.approx(
        sum(p["wall_seconds"] for p in pieces), abs=0.01
    )
    here = resumed.summary["provenance"]["machine"]
    assert [(p["machine"], p["device"]) for p in pieces] == [(here, "cpu"), (here, "cpu")]


def test_a_run_continued_on_another_machine_says_where_each_piece_ran(tmp_path, monkeypatch):
    """A checkpoint carried to another machine (a GPU's, say) and continued there: each piece of
    the run names its own machine, and a record of the reproduction splits the run's time
    between the two machines instead of giving it all to the last."""
    from fairclip.server import run as run_module
    from tools import results

    path, config = tmp_path / CHECKPOINT_FILE, _config("bounded")
    with pytest.raises(KeyboardInterrupt):
        simulate(config, build_task(config), observers=[_StopAfter(3)], checkpoint=Checkpointing(path))
    elsewhere = {"platform": "elsewhere", "processor": "x86_64", "cores": 16, "gpu": "NVIDIA H200"}
    real = run_module.provenance
    monkeypatch.setattr(run_module, "provenance", lambda *args: {**real(*args), "machine": elsewhere})
    resumed = simulate(config, build_task(config), checkpoint=Checkpointing(path))
    where = resumed.summary["provenance"]
    first, second = where["pieces"]
    assert first["machine"] != elsewhere and second["machine"] == elsewhere == where["machine"]
    machines = results._machines([resumed.summary])
    assert [(m["machine"], m["device"], m["runs"]) for m in machines] == [
        (first["machine"], "cpu", 1),
        (elsewhere, "cpu", 1),
    ]
    assert [m["seconds"] for m in machines] == [
        round(first["wall_seconds"], 1),
        round(second["wall_seconds"], 1),
    ]


def test_the_schedule_writes_checkpoints_and_a_finished_one_returns_its_result(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    config = _config("bounded")
    written = []
    saving = Checkpointing(path, every_seconds=1e-9)  # after every round

    def watch(row) -> None:
        written.append(rounds_done(path, config))

    simulate(config, build_task(config), on_round=watch, checkpoint=saving)
    # each round sees the checkpoint of the round before it (the observer runs before the write)
    assert written == list(range(0, ROUNDS))
    assert rounds_done(path, config) == ROUNDS
    again = simulate(
        config, build_task(config), on_round=lambda row: pytest.fail("recomputed"), checkpoint=saving
    )
    _same_run(again, _straight("bounded"))


class _InterruptedExchange:
    """Runs the clients, but is interrupted in round ``round_number``'s second exchange: after the
    round's counts were released, before its contributions."""

    def __init__(self, task, policy, round_number: int):
        self.inner = LocalExecutor(task, policy, 1)
        self.round_number = round_number

    def __call__(self, model, ids, round_number, params, exchange=Exchange.ROUND):
        if round_number == self.round_number and exchange is Exchange.UPDATES:
            raise KeyboardInterrupt
        return self.inner(model, ids, round_number, params, exchange)


def test_a_round_cut_between_its_counts_and_its_updates_is_not_accounted_twice(tmp_path):
    """The counts of round k are accounted when released; a checkpoint taken then would carry
    them into the continued run, which releases round k again: ε would count it twice. The
    checkpoint of round k-1 is kept instead, and the continued run's ε is the straight run's."""
    path = tmp_path / CHECKPOINT_FILE
    config = _config("per-cohort-same-round")
    saving = Checkpointing(path, every_seconds=1e-9)
    with pytest.raises(KeyboardInterrupt):
        simulate(
            config,
            build_task(config),
            lambda task, policy: _InterruptedExchange(task, policy, 5),
            checkpoint=saving,
        )
    stored = read(path, config)["snapshot"]
    assert stored["rounds_completed"] == 4
    assert sum(steps for _, _, steps in stored["accountant_history"]) == 4
    resumed = simulate(config, build_task(config), checkpoint=Checkpointing(path))
    _same_run(resumed, _straight("per-cohort-same-round"))
    server = Run(config, build_task(config))
    with pytest.raises(RuntimeError, match="half released"):
        server.release_counts(1, _counts_of(server))
        server.snapshot()


def _counts_of(server: Run):
    task = server.task
    execute = LocalExecutor(task, server.policy, 1)
    return execute(server.model, server.sample(1), 1, server.broadcast(), Exchange.COUNTS)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["seed=4"], "another configuration"),
        (["policy.initial_bound=0.5"], "another configuration"),
    ],
)
def test_a_checkpoint_of_another_run_is_refused(tmp_path, change, message):
    path = tmp_path / CHECKPOINT_FILE
    config = _config("constant")
    with pytest.raises(KeyboardInterrupt):
        simulate(config, build_task(config), observers=[_StopAfter(3)], checkpoint=Checkpointing(path))
    other = _config("constant", *change)
    with pytest.raises(ConfigError, match=message):
        simulate(other, build_task(other), checkpoint=Checkpointing(path))


def test_a_broken_checkpoint_is_refused_in_one_line(tmp_path):
    path = tmp_path / CHECKPOINT_FILE
    config = _config("constant")
    path.write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match=r"unreadable.*delete it"):
        rounds_done(path, config)
    path.write_bytes(pickle.dumps({"format": 99, "config": {}}))
    with pytest.raises(ConfigError, match="layout 99"):
        rounds_done(path, config)


def test_a_checkpoint_that_cannot_be_written_warns_and_the_run_goes_on(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = _config("constant")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = simulate(
            config,
            build_task(config),
            checkpoint=Checkpointing(blocker / CHECKPOINT_FILE, every_seconds=1e-9),
        )
    assert any("not written after round" in str(w.message) for w in caught)
    _same_run(result, _straight("constant"))
    with pytest.raises(ConfigError, match="interval"):
        Checkpointing(tmp_path / CHECKPOINT_FILE, every_seconds=0)


def test_the_public_simulate_continues_from_its_checkpoint(tmp_path):
    import fairclip

    path = tmp_path / "run.ckpt"
    overrides = {"policy.name": "adaptive", "training.rounds": 8, "seed": 2}
    with pytest.raises(KeyboardInterrupt):
        fairclip.simulate("demo", overrides=overrides, observers=[_StopAfter(5)], checkpoint=path)
    resumed = fairclip.simulate("demo", overrides=overrides, checkpoint=path)
    straight = fairclip.simulate("demo", overrides=overrides)
    pd.testing.assert_frame_equal(resumed.rounds, straight.rounds)
    np.testing.assert_array_equal(resumed.model, straight.model)


def test_runs_on_ray_keep_their_checkpoint_where_the_driver_says(ray_session, tmp_path):
    """The Ray tasks write each run's checkpoint at the path the driver gives (here left after
    the end, since no driver's save_run supersedes it)."""
    from fairclip.sims.executors.jobs import simulate_jobs

    raw = {"constant": _config("constant").as_dict()}
    paths = {key: tmp_path / key / CHECKPOINT_FILE for key in raw}
    jobs = list(raw.items())
    first = dict(simulate_jobs(jobs, data_dir=None, ray=True, checkpoints=paths.__getitem__))
    for key in raw:
        assert rounds_done(paths[key], _config(key)) == ROUNDS
        assert pd.DataFrame(first[key]["rows"]).equals(pd.DataFrame(_straight(key).rows))


def test_runs_on_ray_left_by_their_driver_stop_and_write_their_checkpoint(ray_session, tmp_path):
    """A driver that stops reading the results (Ctrl-C, an error: the generator is closed)
    cancels the runs still going; each writes its checkpoint after the rounds it finished."""
    import psutil

    from fairclip.sims.executors.jobs import simulate_jobs

    endless = 100_000
    long = load_config("demo", None, [*POLICY_SETTINGS["constant"], f"training.rounds={endless}"])
    paths = {key: tmp_path / key / CHECKPOINT_FILE for key in ("short", "long")}
    jobs = [("short", _config("constant").as_dict()), ("long", long.as_dict())]
    results = simulate_jobs(jobs, data_dir=None, ray=True, checkpoints=paths.__getitem__)
    assert next(results)[0] == "short"
    _wait_until_a_run_has_worked(seconds_of_cpu=8.0)  # imports, the task, then its rounds
    assert not paths["long"].exists(), "no periodic checkpoint is due yet"
    closing = time.monotonic()
    results.close()
    assert time.monotonic() - closing < CANCEL_GRACE_SECONDS, "the long run ignored its cancellation"
    done = rounds_done(paths["long"], long)
    assert 0 < done < endless
    workers = psutil.Process().children(recursive=True)  # this test's Ray is started here
    running = [worker for worker in workers if _runs_a_task(worker)]
    assert not running, "a cancelled run is still going"


# ----- a reproduction killed with SIGTERM, then --resume ------------------------------------------


ROUNDS_OF_A_REPRODUCTION = 200


def _reproduce(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "fairclip", "reproduce", "xu-adult", "--seeds", "1",
        "--strategies", "none,constant", "--backend", "local",
        "--max-rounds", str(ROUNDS_OF_A_REPRODUCTION), "--out", str(out), *extra,
    ]  # fmt: skip


DATA_DIR = Path(os.environ.get("FAIRCLIP_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


@pytest.mark.slow
def test_a_reproduction_killed_in_a_run_continues_that_run_with_resume(tmp_path):
    """SIGTERM in the second run: the first is kept, the second's checkpoint holds its finished
    rounds, and --resume computes only the rest -- to the same rows as an uninterrupted run."""
    import fairclip
    from fairclip.scenarios.data import DATASET_FILES

    for relative in DATASET_FILES["adult"]:
        if not (DATA_DIR / relative).is_file():
            pytest.skip(f"{DATA_DIR / relative} is absent: set FAIRCLIP_DATA to the benchmark data folder")
    environment = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FAIRCLIP_DATA": str(DATA_DIR)}
    out = tmp_path / "killed"
    process = subprocess.Popen(_reproduce(out), env=environment, stderr=subprocess.PIPE, text=True)
    runs = out / "runs"
    deadline = time.monotonic() + 300
    while not list(runs.glob("*/summary.json")):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the first run did not finish in time"
        time.sleep(0.05)
    _wait_for_cpu(process.pid, 1.0)  # inside the second run (about 15 ms a round here)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    [unfinished] = [folder for folder in runs.iterdir() if not (folder / "summary.json").exists()]
    done = rounds_done(unfinished / CHECKPOINT_FILE, _config_of(unfinished))
    assert 0 < done < ROUNDS_OF_A_REPRODUCTION, "SIGTERM landed inside the second run's rounds"

    again = tmp_path / "again"
    shutil.copytree(out, again)
    from_python = tmp_path / "from-python"
    shutil.copytree(out, from_python)
    resumed = subprocess.run(_reproduce(out, "--resume"), env=environment, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert not (unfinished / CHECKPOINT_FILE).exists(), "the run's files supersede its checkpoint"
    summary = json.loads((unfinished / "summary.json").read_text())
    pieces = summary["provenance"]["pieces"]
    assert [(p["first_round"], p["last_round"]) for p in pieces] == [
        (1, done),
        (done + 1, ROUNDS_OF_A_REPRODUCTION),
    ]
    assert share_computed_earlier(summary) == done / ROUNDS_OF_A_REPRODUCTION

    # fairclip.reproduce tells a progress display which share of that run was computed before
    calls: list[tuple] = []
    fairclip.reproduce(
        out=from_python,
        mode="resume",
        data_dir=DATA_DIR,
        on_run=lambda key: calls.append(("run", key)),
        on_reused=lambda key: calls.append(("reused", key)),
        on_continued=lambda key, share: calls.append(("continued", key, share)),
    )
    [kept] = [folder.name for folder in runs.iterdir() if folder != unfinished]
    assert calls == [
        ("reused", kept),
        ("continued", unfinished.name, done / ROUNDS_OF_A_REPRODUCTION),
        ("run", unfinished.name),
    ]

    # the same reproduction without --resume computes every run again, from its first round
    fairclip.reproduce(
        "xu-adult",
        seeds=1,
        out=again,
        strategies=["none", "constant"],
        max_rounds=ROUNDS_OF_A_REPRODUCTION,
        data_dir=DATA_DIR,
    )
    in_one_go = json.loads((again / "runs" / unfinished.name / "summary.json").read_text())
    assert "pieces" not in in_one_go["provenance"] and share_computed_earlier(in_one_go) == 0
    expected = pd.read_csv(again / "runs" / unfinished.name / "rounds.csv")
    pd.testing.assert_frame_equal(pd.read_csv(unfinished / "rounds.csv"), expected)
    assert (out / "reproduction.csv").read_text() == (again / "reproduction.csv").read_text()


def _config_of(run_folder: Path):
    from fairclip.scenarios.config import validate

    return validate(pickle.loads((run_folder / CHECKPOINT_FILE).read_bytes())["config"])


RAY_TASK_CPU_SECONDS = 3.0
"""CPU time each run's task spends before the SIGTERM: past its imports and into its rounds (about
15 ms a round here), and far from the end of xu-adult's 2,827 (about 40 s of CPU here). A wall-clock
wait is neither: 20 s left a task without a finished round in a loaded CI run (2026-12-06), and
40 s outlasted both runs on a fast CI machine (2026-12-07)."""


@pytest.mark.slow
def test_a_reproduction_on_ray_killed_writes_the_checkpoints_of_its_running_tasks(tmp_path):
    """SIGTERM to a reproduction whose runs are Ray tasks: the driver takes it as Ctrl-C (not Ray's
    own handler, which exits at once), cancels the tasks, and each writes its checkpoint after
    the rounds it finished; then the driver exits with 143, and the Ray it started is gone. Also
    when it was started with SIGINT ignored, through which Ray cancels a running task."""
    import uuid

    import psutil

    from fairclip.scenarios.data import DATASET_FILES

    for relative in DATASET_FILES["adult"]:
        if not (DATA_DIR / relative).is_file():
            pytest.skip(f"{DATA_DIR / relative} is absent: set FAIRCLIP_DATA to the benchmark data folder")
    mark = uuid.uuid4().hex
    environment = {
        **os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FAIRCLIP_DATA": str(DATA_DIR), MARK_VARIABLE: mark,
    }  # fmt: skip
    out = tmp_path / "killed"
    command = [
        sys.executable, "-m", "fairclip", "reproduce", "xu-adult", "--seeds", "1",
        "--strategies", "none,constant", "--backend", "ray", "--out", str(out),
    ]  # fmt: skip
    # Started as `cmd &` in a script would be: SIGINT ignored, in the driver and Ray's workers.
    process = subprocess.Popen(
        command, env=environment, stderr=subprocess.PIPE, text=True, preexec_fn=_ignore_sigint
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            started = _marked_processes(mark)
            tasks = _task_workers(started)
            if len(tasks) == 2:
                break
            assert process.poll() is None, (_titles(started), process.communicate())
            assert time.monotonic() < deadline, (
                f"the two runs did not start on Ray in time: {_titles(started)}"
            )
            time.sleep(0.2)
        for task in tasks:  # well into both runs' rounds, on a loaded machine as on an idle one
            _wait_for_cpu(task.pid, RAY_TASK_CPU_SECONDS)
        started = _marked_processes(mark)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, err = process.communicate(timeout=120)
        stopping = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, err
    assert stopping < CANCEL_GRACE_SECONDS, "the tasks ignored their cancellation: the driver waited it out"
    assert "terminated; finished results were written" in err
    assert "SIGTERM received" not in err, "Ray's handler, not fairclip's, took the signal"
    folders = sorted((out / "runs").iterdir()) if (out / "runs").is_dir() else []
    assert [folder.name for folder in folders] == ["constant__eps-none__seed-0", "none__eps-none__seed-0"]
    for folder in folders:
        assert not (folder / "summary.json").exists()
        config = _config_of(folder)
        done = rounds_done(folder / CHECKPOINT_FILE, config)
        assert 0 < done < config.training.rounds, f"{folder.name}: {done} rounds in its checkpoint"
    _, alive = psutil.wait_procs([p for p in started if p.pid != process.pid], timeout=30)
    assert not alive, f"Ray processes the driver started are still running: {alive}"


MARK_VARIABLE = "FAIRCLIP_TEST_PROCESS_MARK"
"""Set in a test's driver and so in every process it starts, Ray's included."""


def _marked_processes(mark: str) -> list:
    """The processes whose environment holds ``MARK_VARIABLE=mark``: the driver and all it started,
    found by what they inherit rather than by their parent, which a Ray process need not keep."""
    import psutil

    found = []
    for candidate in psutil.process_iter():
        try:
            if candidate.environ().get(MARK_VARIABLE) == mark:
                found.append(candidate)
        except psutil.Error:  # ended, or not ours to read
            continue
    return found


def _task_workers(processes: list) -> list:
    """The Ray workers that run a run's task (Ray names a worker after the task it runs), without
    the processes they fork, which carry the title too (a CI run saw more than 2 for 2 tasks)."""
    import psutil

    titled = {p.pid: p for p in processes if _runs_a_task(p)}
    workers = []
    for worker in titled.values():
        try:
            if worker.ppid() not in titled:
                workers.append(worker)
        except psutil.Error:  # it has just ended
            continue
    return workers


def _runs_a_task(process) -> bool:
    """Whether Ray has titled ``process`` after a run's task: in its command line, or else in its
    kernel name (15 characters), where setting the title cannot rewrite the command line."""
    import psutil

    if _title(process).startswith("ray::run_simulation"):
        return True
    try:
        return process.name().startswith("ray::run_simula")
    except psutil.Error:  # it has just ended
        return False


def _titles(processes: list) -> list[str]:
    """Each process's command line and kernel name, for a failure's message."""
    import psutil

    titles = []
    for process in processes:
        try:
            titles.append(f"{_title(process)} ({process.name()})")
        except psutil.Error:
            continue
    return sorted(titles)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _wait_for_cpu(pid: int, seconds: float, deadline: float = 120.0) -> None:
    """Wait until process ``pid`` has spent ``seconds`` more of CPU time: the same progress on
    a loaded machine as on an idle one, where a sleep of fixed length is not."""
    import psutil

    process = psutil.Process(pid)
    start, began = sum(process.cpu_times()[:2]), time.monotonic()
    while sum(process.cpu_times()[:2]) - start < seconds:
        assert time.monotonic() - began < deadline, f"process {pid} did not work for {seconds} s of CPU"
        time.sleep(0.02)


def _wait_until_a_run_has_worked(seconds_of_cpu: float, deadline: float = 240.0) -> None:
    """Wait until a Ray worker of this test runs ``run_simulation``, then until it has spent
    ``seconds_of_cpu`` of CPU time since (:func:`_wait_for_cpu`): past its imports and into its
    rounds (a demo round takes well under a second). A fixed sleep is not enough on a loaded
    machine, where the worker may start its task late (CI: 10 s did not suffice)."""
    import psutil

    start = time.monotonic()
    while time.monotonic() - start < deadline:
        for worker in psutil.Process().children(recursive=True):
            if _runs_a_task(worker):
                _wait_for_cpu(worker.pid, seconds_of_cpu, deadline)
                return
        time.sleep(0.2)
    pytest.fail(f"no run started within {deadline:.0f} s")


def _title(process) -> str:
    import psutil

    try:
        command = process.cmdline()
    except psutil.Error:  # it has just ended
        return ""
    return command[0] if command else ""
