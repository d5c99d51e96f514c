"""Issue 69: a real deployment (flower-superlink and flower-supernode processes on 127.0.0.1,
TLS and node authentication) sums with fairclip's SecAgg+. Its own file, apart from
tests/test_deployment.py's (whose helpers it uses), so that the suite's two workers can take the
two long files at once."""

from __future__ import annotations

import contextlib
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
    # one round, in which a node dies (every stage message starts a ClientApp process: a round
    # of a training and an evaluation secure sum takes minutes on two cores)
    "training.rounds": 1,
    # per-cohort evaluation on the nodes' held-out examples, under DP, with no server test set
    "evaluation.clients": True,
    "evaluation.server": False,
}


# The ClientApp of the node that drops out: fairclip's, with a mod that stops at the masking
# stage (stage 2) of round DIE_ROUND's training sum, after the node has taken part in stages 0
# and 1, and tells the test, which then kills the SuperNode: the server has its shares but never
# its masked vector.
DROPOUT_CLIENT = """
import os
import time
from pathlib import Path

from flwr.clientapp import ClientApp

from fairclip.client.app import clients
from fairclip.client.secure_aggregation import AT_EXCHANGE, AT_ROUND, SECAGG
from fairclip.server.secure_aggregation import TRAINING

MARKER = Path({marker!r})
DIE_PARTITION, DIE_ROUND = {partition}, {round}


def stop_before_masking(message, context, call_next):
    record = message.content.config_records.get(SECAGG)
    if (
        record is not None
        and record.get("kind") == "mask"
        and int(record[AT_ROUND]) == DIE_ROUND
        and int(record[AT_EXCHANGE]) == TRAINING
        and int(context.node_config["partition-id"]) == DIE_PARTITION
    ):
        MARKER.write_text(str(os.getpid()))
        time.sleep(3600)  # killed by the test with its SuperNode
    return call_next(message, context)


client_app = ClientApp()
client_app.query()(clients.identify)
client_app.train(mods=[stop_before_masking])(clients.train)
client_app.evaluate()(clients.evaluate)
"""
FAIRCLIP_CLIENTAPP = 'clientapp = "fairclip.client.app:client_app"'


def _with_dropout_client(app: Path, marker: Path, partition: int, round_number: int) -> None:
    """The app copy's ClientApp becomes DROPOUT_CLIENT (on every node; only ``partition`` stops)."""
    (app / "dropout_client.py").write_text(
        DROPOUT_CLIENT.format(marker=str(marker), partition=partition, round=round_number)
    )
    pyproject = app / "pyproject.toml"
    text = pyproject.read_text()
    assert FAIRCLIP_CLIENTAPP in text
    pyproject.write_text(text.replace(FAIRCLIP_CLIENTAPP, 'clientapp = "dropout_client:client_app"'))


@pytest.mark.slow
@pytest.mark.skipif(not _fairclip_apps_present(), reason="fairclip's ServerApp/ClientApp are not there yet")
def test_secure_aggregation_survives_a_supernode_killed_mid_round(
    tmp_path: Path,
    app_dir: Path,  # noqa: F811 (the fixture imported above)
    record_property: pytest.RecordProperty,
) -> None:
    """Issue 69: four SuperNodes (TLS, node authentication) sum with fairclip's SecAgg+; one of
    them is killed mid-round: it has advertised its keys and shared its secrets (stages 0 and 1)
    and received the masking request (stage 2), and dies before it answers. The round
    completes from the three survivors (the dropout is within the threshold: the survivors'
    shares remove the dead node's pairwise masks). After each round the nodes evaluate the
    released model on their own held-out examples (the three left), summed with a second secure sum and
    released with noise (the server holds no test set); ε counts both releases. The public
    outputs hold only public columns; no node disclosed its cohort.

    One policy, bounded: what the real processes add (TLS, node authentication, a SuperNode
    killed, Flower's own timeouts) does not depend on it. Each round here takes minutes, so
    per-cohort's dropouts (its one-hot counts in the masked vector) are checked in process by
    tests/test_secure_aggregation.py's dropout tests."""
    import os
    import signal
    import threading

    from flower_deploy import stop_processes

    started = time.monotonic()
    out = tmp_path / "out"
    marker = tmp_path / "stopped-before-masking"
    dying = SECAGG_NODES - 1
    _with_dropout_client(app_dir, marker, dying, round_number=1)
    config = {**SECAGG_CONFIG, "policy.name": "bounded", "out": str(out)}
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

        def kill_when_it_stops() -> None:
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                if marker.is_file() and marker.read_text().strip():
                    stop_processes([nodes[dying]], grace=1.0)
                    with contextlib.suppress(ProcessLookupError):  # where it outlived its node
                        os.kill(int(marker.read_text()), signal.SIGKILL)
                    killed.set()
                    return
                time.sleep(0.2)

        killer = threading.Thread(target=kill_when_it_stops, daemon=True)
        killer.start()
        result = dep.run_app(app_dir, config, timeout=900)
        killer.join(timeout=5)
        context = f"{result.submit}\n--- run log ---\n{result.logs}\n{dep.log_tail()}"
        assert result.status == "finished:completed", context
        assert killed.is_set() and nodes[dying].poll() is not None, context
    record_property("secagg_deployment_wall_seconds", round(time.monotonic() - started, 1))

    rounds = list(csv.DictReader((out / "rounds.csv").open()))
    assert len(rounds) == SECAGG_CONFIG["training.rounds"], context
    public_columns = set(rounds[0])
    assert not {c for c in public_columns if INTERNAL_ONLY.search(c)}, public_columns
    summary = json.loads((out / "summary.json").read_text())
    secure = summary["privacy"]["secure_aggregation"]
    assert secure["noise_widening"] == 1 + secure["rounding_slack"]
    for row in rounds:  # the noise uses the quantised sensitivity s(1+ρ)
        assert float(row["sensitivity"]) == pytest.approx(float(row["clip_bound"]) * secure["noise_widening"])
    # the nodes' evaluation: noisy per-cohort metrics in every round's row, accounted in ε
    from fairclip.strategies.evaluation import sensitivity as evaluation_sensitivity

    evaluation = summary["config"]["evaluation"]
    delta_e = evaluation_sensitivity(evaluation["max_examples"], evaluation["loss_bound"])
    std = evaluation["noise_multiplier"] * delta_e
    for row in rounds:
        assert {"majority/client_accuracy", "minority/client_loss", "client_accuracy_gap"} <= set(row)
        assert float(row["client_eval_noise_std"]) == pytest.approx(std * secure["noise_widening"])
    assert summary["privacy"]["evaluation_releases"] == SECAGG_CONFIG["training.rounds"]
    assert summary["evaluation"] == "clients (DP)" and set(summary["cohorts"]) == {"majority", "minority"}
    internal = out / "server-internal"
    survivors = [int(row["sampled_clients"]) for row in csv.DictReader((internal / "rounds.csv").open())]
    assert survivors == [SECAGG_NODES - 1], survivors
    events = list(csv.DictReader((internal / "replies.csv").open()))
    assert not any(e["event"] == "skipped" for e in events), events
    sums = [(int(e["round"]), e["reason"]) for e in events if e["event"] == "secure-sum"]
    assert sums == [
        (1, f"training: {SECAGG_NODES - 1} survivors, 1 dropped after masking"),
        (1, f"evaluation: {SECAGG_NODES - 1} survivors, 0 dropped after masking"),
    ], events
    # the dead node answered stages 0 and 1 of the training and nothing after: it is missing
    # from its stage 2, and from the first stage of the evaluation that follows
    gone = [e["reason"] for e in events if e["round"] == "1" and e["event"] in ("missing", "dropped")]
    assert gone and gone[0].startswith("secagg training stage 2: "), events
    stages = ("secagg training stage 2: ", "secagg evaluation stage 0: ")
    assert all(r.startswith(stages) for r in gone), events
    nodes_table = list(csv.DictReader((internal / "nodes.csv").open()))
    assert all(n["cohort"] == "" for n in nodes_table), "under secure aggregation no node tells its cohort"
