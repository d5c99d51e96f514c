"""fairclip on a real Flower deployment: SuperLink and SuperNodes on 127.0.0.1.

The SuperLink runs with TLS (throw-away CA) and SuperNode authentication; SuperNode keys are
registered through the Control API. See `tests/flower_deploy.py` for what Flower 1.41 expects.
No network beyond the loopback interface is used.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flower_deploy import (
    BIN_DIR,
    FlowerDeployment,
    NodeKeys,
    TlsFiles,
    deployment,
    free_port,
    make_node_keys,
    make_tls_files,
)

REPO = Path(__file__).resolve().parents[1]

NUM_NODES = 3
RUN_CONFIG = {
    "scenario": "bimodal-mean",
    "policy.name": "bounded",
    "federation.num_clients": NUM_NODES,
    "federation.sample_rate": 1.0,
    "training.rounds": 3,
    # bimodal-mean adds no noise by default (ε = ∞); σ = 1 gives a finite ε
    "privacy.noise_multiplier": 1.0,
}

# Directories of the checkout that a Flower App build never needs.
_NOT_APP = (".git", ".venv", "runs", "out", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache")


def _fairclip_apps_present() -> bool:
    pyproject = (REPO / "pyproject.toml").read_text()
    return (
        (REPO / "server" / "app.py").is_file()
        and (REPO / "client" / "app.py").is_file()
        and "[tool.flwr.app.components]" in pyproject
    )


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """A copy of the Flower App (this checkout): `flwr run` would rewrite a pyproject.toml
    that still has a legacy `[tool.flwr.federations]` table, and never may in the checkout."""
    target = tmp_path / "app"
    shutil.copytree(REPO, target, ignore=shutil.ignore_patterns(*_NOT_APP, ".hypothesis"))
    return target


def _node_config(partition: int, partitions: int = NUM_NODES) -> dict[str, object]:
    return {"partition-id": partition, "num-partitions": partitions}


@pytest.mark.slow  # imports Flower's CLI: a few seconds
def test_harness_writes_keys_and_certificates_flower_accepts(tmp_path: Path) -> None:
    """Fast check of the formats: Flower's own loaders accept the keys, the cert names 127.0.0.1."""
    from flwr.cli.supernode.register import try_load_public_key

    keys = make_node_keys(tmp_path, "node")
    assert keys.public_key.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert try_load_public_key(keys.public_key).startswith(b"-----BEGIN PUBLIC KEY-----")
    assert load_ssh_private_key(keys.private_key.read_bytes(), None).curve.name == "secp384r1"

    tls = make_tls_files(tmp_path / "certs")
    cert = x509.load_pem_x509_certificate(tls.server_cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]


DEMO_CONFIG = {
    "scenario": "demo",
    # three clients: two on partitions of the scenario, one on its own data file
    "set": "scenario.cohorts.majority.share=0.5; scenario.cohorts.minority.share=0.5",
    "policy.name": "bounded",
    "federation.num_clients": NUM_NODES,
    "federation.sample_rate": 1.0,
    "training.rounds": 3,
}

INTERNAL_ONLY = re.compile(
    r"sampled|accepted|dropped|missing|unexpected|clipped_fraction|norm_|nonfinite|seconds"
)
"""Names of values DP does not cover: exact counts, diagnostics, timings."""


def _keys(value: object) -> set[str]:
    """Every key of a JSON document, at any depth."""
    if isinstance(value, dict):
        return set(value) | {key for item in value.values() for key in _keys(item)}
    if isinstance(value, list):
        return {key for item in value for key in _keys(item)}
    return set()


@pytest.mark.slow
@pytest.mark.skipif(not _fairclip_apps_present(), reason="fairclip's ServerApp/ClientApp are not there yet")
def test_a_deployment_publishes_only_what_dp_covers(
    tmp_path: Path, app_dir: Path, record_property: pytest.RecordProperty
) -> None:
    """Issue 17: TLS, node authentication, partition nodes and a data-path node, as the README
    shows. The server receives contributions and report bits only (no diagnostics, no cohort
    label for `bounded`), and its public outputs and INFO log hold no exact count."""
    started = time.monotonic()
    out = tmp_path / "out"
    data_file = tmp_path / "client.npz"
    rng = np.random.default_rng(0)
    np.savez(data_file, x=rng.normal(size=(24, 10)).astype(np.float32), y=rng.integers(0, 2, 24))
    node_configs = [
        _node_config(0),
        _node_config(1),
        {**_node_config(2), "data-path": str(data_file), "cohort": "minority"},
    ]
    with deployment(tmp_path / "deploy") as dep:
        dep.start_superlink()
        keys = [make_node_keys(tmp_path / "keys", f"supernode-{i}") for i in range(NUM_NODES)]
        registered = {dep.register_supernode(k) for k in keys}
        for i, (k, node_config) in enumerate(zip(keys, node_configs, strict=True)):
            dep.start_supernode(f"supernode-{i}", keys=k, node_config=node_config)
        online = dep.wait_for_nodes(NUM_NODES)
        assert {int(str(n["node-id"])) for n in online} == registered

        result = dep.run_app(app_dir, {**DEMO_CONFIG, "out": str(out)}, timeout=240)
        context = f"{result.submit}\n--- run log ---\n{result.logs}\n{dep.log_tail()}"
        assert result.status == "finished:completed", context
    wall = time.monotonic() - started
    record_property("deployment_wall_seconds", round(wall, 1))
    print(f"deployment test wall time: {wall:.1f} s")

    # the public release: only values DP covers, ε with its parameters, secure noise by default
    rounds = list(csv.DictReader((out / "rounds.csv").open()))
    assert len(rounds) == DEMO_CONFIG["training.rounds"]
    public_columns = set(rounds[0])
    assert not {c for c in public_columns if INTERNAL_ONLY.search(c)}, public_columns
    assert {"clip_bound", "noise_std", "epsilon", "noisy_report_0", "minority/accuracy"} <= public_columns
    per_round = [float(row["epsilon"]) for row in rounds]
    assert all(math.isfinite(e) for e in per_round) and per_round == sorted(per_round)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == DEMO_CONFIG["training.rounds"]
    assert per_round[-1] == pytest.approx(float(summary["epsilon"]))
    assert {"delta", "accountant", "sample_rate", "rounds", "noise_multiplier"} <= set(summary["privacy"])
    assert not {key for key in _keys(summary) if INTERNAL_ONLY.search(key)}, summary
    assert "OpenDP" in summary["noise_source"], summary["noise_source"]

    # what the server received and keeps to itself: every reply accepted -- so none carried
    # diagnostics or anything beyond its contribution and report bit -- and no cohort label
    internal = out / "server-internal"
    assert "NOT DP-PROTECTED" in (internal / "README.txt").read_text()
    internal_rounds = list(csv.DictReader((internal / "rounds.csv").open()))
    for row in internal_rounds:
        assert (row["accepted_replies"], row["dropped_replies"], row["unexpected_replies"]) == ("3", "0", "0")
        assert row["sampled_clients"] == "3"
        assert row["clipped_fraction"] == "" and row["minority/norm_before"] == "", row
    assert list(csv.DictReader((internal / "replies.csv").open())) == []
    nodes = list(csv.DictReader((internal / "nodes.csv").open()))
    assert sorted(int(n["client"]) for n in nodes) == [0, 1, 2]
    assert {int(n["node"]) for n in nodes} == registered
    assert all(n["cohort"] == "" for n in nodes), "bounded must not learn cohorts"

    # the ServerApp's log: no exact count at INFO, and Flower's MetricRecords public only
    logs = result.logs
    assert "operating-system entropy" in logs and "OpenDP" in logs, logs
    assert not INTERNAL_ONLY.search(logs.replace("server-internal", "")), logs
    records = re.findall(r"Aggregated MetricRecord: \{([^}]*)\}", logs)
    assert records, logs
    for record in records:
        names = set(re.findall(r"'([^']+)':", record))
        assert names and names <= public_columns, names - public_columns


@pytest.mark.slow
@pytest.mark.skipif(not _fairclip_apps_present(), reason="fairclip's ServerApp/ClientApp are not there yet")
def test_a_node_cannot_take_a_registered_nodes_partition(tmp_path: Path, app_dir: Path) -> None:
    """Issue 68: a partition claimed by two nodes used to refuse both, so one authenticated node
    could evict another. With node-partitions (the node ids `flwr supernode register` printed)
    the registered node keeps its partition and only the other claimant is refused; the run
    completes."""
    with deployment(tmp_path / "deploy") as dep:
        dep.start_superlink()
        nodes = []
        for i in range(2):
            keys = make_node_keys(tmp_path / "keys", f"supernode-{i}")
            nodes.append(dep.register_supernode(keys))
            dep.start_supernode(f"supernode-{i}", keys=keys, node_config=_node_config(0, 2))
        dep.wait_for_nodes(2)
        honest, hostile = nodes
        config = {
            **RUN_CONFIG, "federation.num_clients": 2, "training.rounds": 1, "out": str(tmp_path / "o"),
            "node-partitions": f"{honest}:0",
        }  # fmt: skip
        result = dep.run_app(app_dir, config, timeout=150)
        assert result.status == "finished:completed", (result.status, result.logs[-3000:])
    assert re.search(rf"refused node {hostile}: partition-id=0 belongs to node {honest}", result.logs), (
        result.logs
    )
    assert f"refused node {honest}" not in result.logs, result.logs


@pytest.mark.slow
def test_a_revoked_supernode_can_no_longer_join(tmp_path: Path) -> None:
    """Issue 17, point 7: `flwr supernode unregister` takes a registered, online node out of the
    federation, and its key cannot bring it back."""
    with deployment(tmp_path) as dep:
        dep.start_superlink()
        keys = make_node_keys(tmp_path / "keys", "revoked")
        node_id = dep.register_supernode(keys)
        first = dep.start_supernode("revoked", keys=keys, node_config=_node_config(0, 1))
        assert [int(str(n["node-id"])) for n in dep.wait_for_nodes(1)] == [node_id]

        dep.flwr("supernode", "unregister", str(node_id), dep.connection)
        status = {int(str(n["node-id"])): n["status"] for n in dep.list_supernodes()}
        assert status == {node_id: "unregistered"}, status
        first.wait(timeout=30)
        assert not [n for n in dep.list_supernodes() if n.get("status") == "online"]

        again = dep.start_supernode("revoked-again", keys=keys, node_config=_node_config(0, 1))
        exit_status = again.wait(timeout=60)
        assert exit_status not in (None, 0), dep.log_tail()
        assert "Failed to activate SuperNode" in again.log(), again.log()
        assert not [n for n in dep.list_supernodes() if n.get("status") == "online"]


@pytest.mark.slow
def test_supernode_with_unregistered_key_is_refused(tmp_path: Path) -> None:
    with deployment(tmp_path) as dep:
        dep.start_superlink()
        known = make_node_keys(tmp_path / "keys", "known")
        known_id = dep.register_supernode(known)
        dep.start_supernode("known", keys=known, node_config=_node_config(0, 1))

        rogue = dep.start_supernode(
            "rogue", keys=make_node_keys(tmp_path / "keys", "rogue"), node_config=_node_config(0, 1)
        )
        status = rogue.wait(timeout=60)
        assert status not in (None, 0), dep.log_tail()
        assert "Failed to activate SuperNode" in rogue.log(), rogue.log()

        # without any key a SuperNode would register itself, which the SuperLink refuses too
        anonymous = dep.start_supernode("anonymous", node_config=_node_config(0, 1))
        status = anonymous.wait(timeout=60)
        assert status not in (None, 0), dep.log_tail()
        assert "Failed to initialize the connection to the SuperLink" in anonymous.log(), anonymous.log()

        online = dep.wait_for_nodes(1)
        assert [int(str(n["node-id"])) for n in online] == [known_id]
        assert [int(str(n["node-id"])) for n in dep.list_supernodes()] == [known_id]


@pytest.mark.slow
def test_plaintext_supernode_cannot_connect_to_tls_superlink(tmp_path: Path) -> None:
    # Without SuperNode authentication TLS is the only thing in the way: a SuperNode that
    # trusts the CA joins, a plain-text one and one that trusts another CA do not.
    with deployment(tmp_path, supernode_auth=False) as dep:
        dep.start_superlink()
        plain = dep.start_supernode("plaintext", insecure=True, max_retries=2, node_config=_node_config(0, 1))
        other_ca = make_tls_files(tmp_path / "other-ca")
        stranger = dep.start_supernode(
            "other-ca", root_certificates=other_ca.ca_cert, max_retries=2, node_config=_node_config(0, 1)
        )
        for proc in (plain, stranger):
            status = proc.wait(timeout=60)
            assert status not in (None, 0), dep.log_tail()
            assert "Failed to initialize the connection to the SuperLink" in proc.log(), proc.log()
        assert dep.list_supernodes() == []

        dep.start_supernode("tls", node_config=_node_config(0, 1))
        assert len(dep.wait_for_nodes(1)) == 1


@pytest.mark.slow
def test_superlink_refuses_supernode_auth_without_tls(tmp_path: Path) -> None:
    dep = FlowerDeployment(tmp_path, tls=False, supernode_auth=False)
    try:
        with pytest.raises(RuntimeError, match="requires encrypted TLS"):
            dep.start_superlink(timeout=30, extra_args=["--enable-supernode-auth"])
    finally:
        dep.stop()


def _option(command: list[str], flag: str) -> str:
    return str(command[command.index(flag) + 1])


def test_compose_file_wires_tls_auth_and_one_partition_per_supernode() -> None:
    yaml = pytest.importorskip("yaml")
    services = yaml.safe_load((REPO / "docker" / "compose.yml").read_text())["services"]
    superlink = [str(arg) for arg in services["superlink"]["command"]]
    assert "--enable-supernode-auth" in superlink and "--insecure" not in superlink
    assert _option(superlink, "--isolation") == "process"
    for flag in ("--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"):
        assert _option(superlink, flag).startswith("certs/")
    port = _option(superlink, "--port")
    assert _option(services["serverapp"]["command"], "--runtime-api-address") == f"superlink:{port}"

    supernodes = sorted(name for name in services if name.startswith("supernode-"))
    assert len(supernodes) >= 2
    partitions = []
    for name in supernodes:
        command = [str(arg) for arg in services[name]["command"]]
        assert _option(command, "--superlink") == f"superlink:{port}"
        assert _option(command, "--root-certificates") == "certs/ca.crt"
        assert _option(command, "--auth-supernode-private-key") == f"keys/{name}"
        assert _option(command, "--isolation") == "process"
        config = dict(pair.split("=") for pair in _option(command, "--node-config").split())
        assert int(config["num-partitions"]) == len(supernodes)
        partitions.append(int(config["partition-id"]))
        clientapp = services[name.replace("supernode", "clientapp")]
        node_port = _option(command, "--port")
        assert _option(clientapp["command"], "--runtime-api-address") == f"{name}:{node_port}"
    assert sorted(partitions) == list(range(len(supernodes)))
    # a deployment never turns on the simulation diagnostics, nor turns secure noise off
    text = (REPO / "docker" / "compose.yml").read_text()
    assert "simulation-diagnostics" not in text and "secure_noise" not in text


@pytest.mark.slow
@pytest.mark.skipif(not _fairclip_apps_present(), reason="fairclip's ServerApp/ClientApp are not there yet")
@pytest.mark.skipif(
    not (shutil.which("openssl") and shutil.which("ssh-keygen")), reason="needs openssl and ssh-keygen"
)
def test_compose_topology_with_generated_certificates(tmp_path: Path, app_dir: Path) -> None:
    """docker/compose.yml without Docker: the files of docker/generate-certs.sh, SuperLink and
    SuperNodes in isolation mode `process`, ServerApp and ClientApps run by their own
    `flower-superexec` processes, as the app containers run them."""
    certs = tmp_path / "certs"
    subprocess.run(
        [
            "bash",
            str(REPO / "docker" / "generate-certs.sh"),
            "-n",
            "2",
            "-o",
            str(certs),
            "127.0.0.1",
            "localhost",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    tls = TlsFiles(certs / "ca.crt", certs / "ca.key", certs / "server.pem", certs / "server.key")
    out = tmp_path / "out"
    superexec = str(BIN_DIR / "flower-superexec")
    with deployment(tmp_path / "deploy", tls_files=tls) as dep:
        dep.start_superlink(extra_args=["--isolation", "process"])
        dep.spawn(
            "serverapp",
            [superexec, "--root-certificates", str(tls.ca_cert), "--runtime-api-address", dep.address],
        )
        for i in (1, 2):
            keys = NodeKeys(certs / f"supernode-{i}", certs / f"supernode-{i}.pub")
            dep.register_supernode(keys)
            port = free_port()
            dep.start_supernode(
                f"supernode-{i}",
                keys=keys,
                node_config=_node_config(i - 1, 2),
                runtime_port=port,
                extra_args=["--isolation", "process"],
            )
            dep.spawn(
                f"clientapp-{i}", [superexec, "--insecure", "--runtime-api-address", f"127.0.0.1:{port}"]
            )
        dep.wait_for_nodes(2)
        config = {**RUN_CONFIG, "federation.num_clients": 2, "training.rounds": 2, "out": str(out)}
        result = dep.run_app(app_dir, config, timeout=150)
        assert result.status == "finished:completed", f"{result.submit}\n{result.logs}\n{dep.log_tail()}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 2
    assert math.isfinite(float(summary["epsilon"]))
