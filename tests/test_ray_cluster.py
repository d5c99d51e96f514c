"""A real multi-node Ray cluster on this machine: `ray start --head` plus a second `ray start
--address=...` node, one CPU each. `fairclip run --backend ray --address` and `fairclip compare
--address` must give the numbers of the local backend, with actors on both nodes.

The nodes are started with ``--block`` in their own process groups and stopped by those ids
(never ``ray stop``, which would stop every Ray on the machine). Where ``ray start`` cannot run,
the module is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow

RAY = Path(sys.executable).parent / "ray"
ROUNDS = 3
SCENARIO = ["--scenario", "demo", "--set", "federation.num_clients=60", "--set", f"training.rounds={ROUNDS}"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(RAY_USAGE_STATS_ENABLED="0", FLWR_TELEMETRY_ENABLED="0", RAY_DEDUP_LOGS="0")
    return env


def _start_node(arguments: list[str], log: Path) -> subprocess.Popen:
    command = [str(RAY), "start", "--block", "--num-cpus=1", "--disable-usage-stats", *arguments]
    with log.open("w") as sink:
        return subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=_env(), start_new_session=True
        )


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the node's process group (``ray start --block`` then stops its own Ray processes),
    SIGKILL what is left after a grace period."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # the group may outlive its leader: clear it
        os.killpg(process.pid, signal.SIGKILL)


def _cluster_nodes(address: str) -> int:
    """How many alive nodes the cluster at ``address`` has (asked from a separate driver)."""
    probe = (
        f"import ray; ray.init(address={address!r}, include_dashboard=False, log_to_driver=False); "
        "print(sum(1 for node in ray.nodes() if node['Alive'])); ray.shutdown()"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=_env(), timeout=120
    )
    return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """HOST:PORT of a 2-node Ray cluster (1 CPU per node), or a skip with the reason."""
    if not RAY.exists():
        pytest.skip(f"{RAY} is absent: the ray command line is not installed")
    logs = tmp_path_factory.mktemp("ray-nodes")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    head = _start_node(
        ["--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--include-dashboard=false"],
        logs / "head.log",
    )
    nodes = [head]
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and head.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        if head.poll() is not None:
            pytest.skip(f"ray start --head cannot run here: {(logs / 'head.log').read_text()[-600:]}")
        nodes.append(
            _start_node([f"--address={address}", "--node-ip-address=127.0.0.1"], logs / "worker.log")
        )
        deadline = time.monotonic() + 120
        while _cluster_nodes(address) < 2:
            if time.monotonic() > deadline or nodes[1].poll() is not None:
                pytest.skip("the second ray node did not join: " + (logs / "worker.log").read_text()[-600:])
            time.sleep(2)
        yield address
    finally:
        for node in reversed(nodes):
            _stop(node)


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
    assert local_summary["provenance"]["execution"] == {"backend": "local", "workers": 1}
    assert summary["provenance"]["execution"] == {"backend": "ray", "actors": 2, "nodes": 2}


def test_compare_on_a_two_node_cluster_gives_the_local_numbers(cluster, tmp_path):
    sweep = ["compare", *SCENARIO, "--strategies", "constant", "--epsilons", "2", "--seeds", "1"]
    _fairclip(*sweep, "--out", str(tmp_path / "local"))
    _fairclip(*sweep, "--address", cluster, "--out", str(tmp_path / "cluster"))
    local = pd.read_csv(tmp_path / "local" / "summary.csv")
    remote = pd.read_csv(tmp_path / "cluster" / "summary.csv")
    numbers = [c for c in local.columns if pd.api.types.is_numeric_dtype(local[c]) and "seconds" not in c]
    pd.testing.assert_frame_equal(remote[numbers], local[numbers])
