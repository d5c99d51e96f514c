"""Test-wide settings: no Flower telemetry, and a helper to run the CLI in-process."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

LONGEST_FILES_FIRST = (
    "test_bench.py",
    "test_reproduce.py",
    "test_deployment.py",
    "test_flower_app.py",
    "test_secure_deployment.py",
    "test_compare.py",
    "test_client_evaluation.py",
    "test_ray_cluster.py",
    "test_checkpoint.py",
    "test_docs.py",
    "test_flower_example.py",
    "test_hostile_use.py",
    "test_scale_out.py",
)
"""The test files that take longest (most first; measured by CI's slowest-durations list), which
the xdist workers take first. ``--dist loadfile`` hands each worker one file at a time, in
collection order (``--no-loadscope-reorder``); a long file taken last kept one worker busy for
minutes after the other had finished. Every other file follows, those with more tests first."""


def pytest_collection_modifyitems(session, config, items):
    """Longest files first (:data:`LONGEST_FILES_FIRST`), then by number of tests, most first;
    a file's tests keep their order."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.path.name] = counts.get(item.path.name, 0) + 1

    def rank(item) -> tuple[int, int, str]:
        name = item.path.name
        if name in LONGEST_FILES_FIRST:
            return (LONGEST_FILES_FIRST.index(name), 0, name)
        return (len(LONGEST_FILES_FIRST), -counts[name], name)

    items.sort(key=rank)  # stable: the order within a file stays


@pytest.fixture
def cli(capsys):
    """Run ``fairclip`` in-process; returns (exit status, stdout, stderr)."""
    from fairclip.cli import main

    def invoke(*args: str) -> tuple[int, str, str]:
        try:
            main(list(args))
            status = 0
        except SystemExit as done:
            status = int(done.code or 0)
        captured = capsys.readouterr()
        if status == 2:  # bad input: its line comes first, with nothing (a display's blank line) before it
            assert captured.err.startswith("fairclip: error: "), captured.err
        return status, captured.out, captured.err

    return invoke


@pytest.fixture
def server_task_identity(monkeypatch):
    """Outside a Flower runtime, messages need the identity a ServerApp process would have."""
    from flwr.supercore.task_identity import TaskIdentity

    for attribute, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attribute, value)


@pytest.fixture
def one_memory_heavy_test_at_a_time(tmp_path_factory):
    """Tests that take many GB (ResNet-18's per-example gradients and 64 block sums: 6-10 GB)
    run one at a time across the suite's xdist workers: an exclusive lock on a file in the
    run's shared temporary folder. Two at once ran the 24 GB machine into Ray's memory killer."""
    import fcntl

    shared = tmp_path_factory.getbasetemp().parent  # the workers' folders sit side by side in it
    with open(shared / "memory-heavy.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
        fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray of 2 CPUs for the tests of one module (shut down after them)."""
    import ray

    from fairclip.sims.executors.ray import ensure_ray

    ensure_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def plugin_registrations():
    """What a test registers (``fairclip.policies.register``, a ``Scenario``'s objects) is
    forgotten after it: the registry is process-wide, and Ray tasks of later tests receive it."""
    from fairclip import plugins

    saved = {kind: plugins.registered(kind) for kind in plugins.ENTRY_POINT_GROUPS}
    yield
    for kind, names in saved.items():
        plugins._REGISTERED[kind].clear()
        plugins._REGISTERED[kind].update(names)
