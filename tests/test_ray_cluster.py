"""A real multi-node Ray cluster on this machine: `ray start --head` plus a second `ray start
--address=...` node, one CPU each. `fairclip run --backend ray --address` and `fairclip compare
--address` must give the numbers of the local backend, with actors on both nodes.

The nodes come from :func:`fairclip.benchmarks.local_cluster.local_cluster` (``ray start --block``
in process groups of their own, stopped by those ids, never ``ray stop``). Where ``ray start``
cannot run, the module is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.slow

ROUNDS = 3
SCENARIO = ["--scenario", "demo", "--set", "federation.num_clients=60", "--set", f"training.rounds={ROUNDS}"]


@pytest.fixture(scope="module")
def cluster():
    """HOST:PORT of a 2-node Ray cluster (1 CPU per node), or a skip with the reason."""
    from fairclip.benchmarks.local_cluster import ClusterError, local_cluster

    try:
        with local_cluster(nodes=2, cpus_per_node=1) as address:
            yield address
    except ClusterError as error:
        pytest.skip(f"no local Ray cluster: {error}")


def _env() -> dict[str, str]:
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "FLWR_TELEMETRY_ENABLED": "0"}


def _fairclip(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "fairclip", *args], capture_output=True, text=True, env=_env(), timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _numbers(run: Path) -> tuple[pd.DataFrame, np.ndarray, dict]:
    rows = pd.read_csv(run / "rounds.csv")
    summary = json.loads((run / "summary.json").read_text())
    return rows, np.load(run / "model.npy"), summary


def test_run_on_a_two_node_cluster_gives_the_local_numbers(cluster, tmp_path):
    _fairclip("run", *SCENARIO, "--backend", "local", "--out", str(tmp_path / "local"))
    _fairclip("run", *SCENARIO, "--backend", "ray", "--address", cluster, "--out", str(tmp_path / "cluster"))
    local_rows, local_model, local_summary = _numbers(tmp_path / "local")
    rows, model, summary = _numbers(tmp_path / "cluster")
    assert len(rows) == ROUNDS
    pd.testing.assert_frame_equal(rows, local_rows)
    np.testing.assert_array_equal(model, local_model)
    assert summary["epsilon"] == local_summary["epsilon"] and summary["overall"] == local_summary["overall"]
    device = "cuda" if torch.cuda.is_available() else "cpu"  # training.device auto
    assert local_summary["provenance"]["execution"] == {
        "executor": "local",
        "backend": "local",
        "workers": 1,
        "device": device,
    }
    assert summary["provenance"]["execution"] == {
        "executor": "ray",
        "backend": "ray",
        "actors": 2,
        "nodes": 2,
        "device": device,
    }


def test_compare_on_a_two_node_cluster_gives_the_local_numbers(cluster, tmp_path):
    sweep = ["compare", *SCENARIO, "--strategies", "constant", "--epsilons", "2", "--seeds", "1"]
    _fairclip(*sweep, "--out", str(tmp_path / "local"))
    _fairclip(*sweep, "--address", cluster, "--out", str(tmp_path / "cluster"))
    local = pd.read_csv(tmp_path / "local" / "summary.csv")
    remote = pd.read_csv(tmp_path / "cluster" / "summary.csv")
    numbers = [c for c in local.columns if pd.api.types.is_numeric_dtype(local[c]) and "seconds" not in c]
    pd.testing.assert_frame_equal(remote[numbers], local[numbers])


def test_a_local_cluster_leaves_the_machines_ray_record_as_it_was():
    """``ray start`` records its cluster for every later ``ray.init()`` without an address
    (Flower's simulation runtime hung on a record of a stopped test cluster): the record is the
    same before, during and after :func:`local_cluster`."""
    from fairclip.benchmarks.local_cluster import ClusterError, _machine_record, local_cluster

    record = _machine_record()
    before = record.read_bytes() if record.is_file() else None
    try:
        with local_cluster(nodes=1, cpus_per_node=1) as address:
            during = record.read_bytes() if record.is_file() else None
            assert during == before, f"the machine's record now points at {address}"
    except ClusterError as error:
        pytest.skip(f"no local Ray cluster: {error}")
    assert (record.read_bytes() if record.is_file() else None) == before


def test_an_address_other_than_the_connected_cluster_is_refused(cluster):
    """In a process already connected to a local Ray, ``address`` naming another cluster is one
    error line, not a silent run on the local Ray."""
    script = (
        "from fairclip.sims.executors.ray import ensure_ray\n"
        "from fairclip.scenarios.errors import ConfigError\n"
        "ensure_ray(None, 1)\n"
        "ensure_ray(None, 1)  # the same connection: fine\n"
        "try:\n"
        f"    ensure_ray({cluster!r})\n"
        "except ConfigError as error:\n"
        "    print('refused:', error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"refused: --address {cluster}: this process is already connected" in done.stdout


def test_with_token_authentication_the_cluster_runs_fairclip_and_refuses_a_driver_without_it(
    tmp_path, monkeypatch
):
    """The README's advice for a network you do not trust. Ray's servers listen on every
    interface and take any caller unless token authentication is on; with the same
    ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` on both nodes and the driver, fairclip runs on
    the cluster as before, and a driver without the token is refused in one error line, having
    written nothing."""
    import secrets

    from fairclip.benchmarks.local_cluster import ClusterError, local_cluster

    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # read by the nodes and the drivers started here
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    try:
        with local_cluster(nodes=2, cpus_per_node=1) as address:
            on_cluster = ["run", *SCENARIO, "--backend", "ray", "--address", address]
            _fairclip(*on_cluster, "--out", str(tmp_path / "with"))
            without = {k: v for k, v in _env().items() if not k.startswith("RAY_AUTH")}
            stranger = subprocess.run(
                [sys.executable, "-m", "fairclip", *on_cluster, "--out", str(tmp_path / "without")],
                capture_output=True,
                text=True,
                env=without,
                timeout=600,
            )
    except ClusterError as error:
        pytest.skip(f"no local Ray cluster: {error}")
    summary = json.loads((tmp_path / "with" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["rounds_completed"] == ROUNDS
    assert summary["provenance"]["execution"]["nodes"] == 2  # actors on both nodes, each with the token
    assert stranger.returncode == 1, stranger.stderr[-2000:]
    last = stranger.stderr.strip().splitlines()[-1]
    assert last.startswith("fairclip: error: Failed to connect to Ray cluster"), last
    assert not (tmp_path / "without" / "summary.json").exists()
