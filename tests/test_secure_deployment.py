"""Issue 69: a real deployment (flower-superlink and flower-supernode processes on 127.0.0.1,
TLS and node authentication) sums with fairclip's SecAgg+. Its own file, apart from
tests/test_deployment.py's (whose helpers it uses), so that the suite's two workers take the two
long files at once."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest
from flower_deploy import deployment, make_node_keys
from test_deployment import DEMO_CONFIG, INTERNAL_ONLY, _fairclip_apps_present, _node_config, app_dir  # noqa: F401

SECAGG_NODES = 4
SECAGG_CONFIG = {
    **DEMO_CONFIG,
    "federation.num_clients": SECAGG_NODES,
    "privacy.secure_aggregation": True,
    # a stage waits this long for a node that died; each message starts a ClientApp process
    "privacy.secagg_stage_timeout": 180.0,
    "training.rounds": 2,  # a node is killed once round 1 is out: round 2 runs without it
}


@pytest.mark.slow
@pytest.mark.skipif(not _fairclip_apps_present(), reason="fairclip's ServerApp/ClientApp are not there yet")
def test_secure_aggregation_survives_a_supernode_killed_mid_run(
    tmp_path: Path,
    app_dir: Path,  # noqa: F811 (the fixture imported above)
    record_property: pytest.RecordProperty,
) -> None:
    """Issue 69: four SuperNodes (TLS, node authentication) sum with fairclip's SecAgg+ under
    ``per-cohort``; one is killed once the first round is out. Every round completes (the dropout
    is within the threshold), and the public outputs hold only public columns; no node disclosed
    its cohort. ``per-cohort`` is the policy whose masked vector holds the most (a contribution
    and one-hot cohort counts, the cohort known to no one): the other policies' vectors are
    checked against the plain sum in process (tests/test_secure_aggregation.py), and a
    second real deployment of four nodes, most of it waiting out the dead node's stage
    timeout, cost four minutes of the suite."""
    policy = "per-cohort"
    import threading

    from flower_deploy import stop_processes

    started = time.monotonic()
    out = tmp_path / "out"
    config = {**SECAGG_CONFIG, "policy.name": policy, "out": str(out)}
    with deployment(tmp_path / "deploy") as dep:
        dep.start_superlink()
        keys = [make_node_keys(tmp_path / "keys", f"supernode-{i}") for i in range(SECAGG_NODES)]
        for k in keys:
            dep.register_supernode(k)
        nodes = [
            dep.start_supernode(f"supernode-{i}", keys=k, node_config=_node_config(i, SECAGG_NODES))
            for i, k in enumerate(keys)
        ]
        dep.wait_for_nodes(SECAGG_NODES)
        killed = threading.Event()

        def kill_after_first_round() -> None:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                rows = out / "rounds.csv"
                if rows.is_file() and len(rows.read_text().strip().splitlines()) >= 2:
                    stop_processes([nodes[-1]], grace=1.0)
                    killed.set()
                    return
                time.sleep(0.5)

        killer = threading.Thread(target=kill_after_first_round, daemon=True)
        killer.start()
        result = dep.run_app(app_dir, config, timeout=900)
        killer.join(timeout=5)
        context = f"{result.submit}\n--- run log ---\n{result.logs}\n{dep.log_tail()}"
        assert result.status == "finished:completed", context
    record_property("secagg_deployment_wall_seconds", round(time.monotonic() - started, 1))
    assert killed.is_set(), context

    rounds = list(csv.DictReader((out / "rounds.csv").open()))
    assert len(rounds) == SECAGG_CONFIG["training.rounds"], context
    public_columns = set(rounds[0])
    assert not {c for c in public_columns if INTERNAL_ONLY.search(c)}, public_columns
    summary = json.loads((out / "summary.json").read_text())
    secure = summary["privacy"]["secure_aggregation"]
    assert secure["noise_widening"] == 1 + secure["rounding_slack"]
    for row in rounds:  # the noise uses the quantised sensitivity s(1+ρ)
        assert float(row["sensitivity"]) == pytest.approx(float(row["clip_bound"]) * secure["noise_widening"])
    internal = out / "server-internal"
    survivors = [int(row["sampled_clients"]) for row in csv.DictReader((internal / "rounds.csv").open())]
    assert survivors[0] == SECAGG_NODES and survivors[-1] == SECAGG_NODES - 1, survivors
    events = list(csv.DictReader((internal / "replies.csv").open()))
    assert not any(e["event"] == "skipped" for e in events), events
    nodes_table = list(csv.DictReader((internal / "nodes.csv").open()))
    assert all(n["cohort"] == "" for n in nodes_table), "under secure aggregation no node tells its cohort"
