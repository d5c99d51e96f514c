"""A Ray cluster of several nodes on this machine, started with ``ray start`` as on real
machines: what the multi-node test and benchmark W5 run against.

:func:`local_cluster` starts a head node and ``nodes - 1`` further nodes (each ``ray start
--block`` in a process group of its own, ``cpus_per_node`` CPUs, dashboard off, usage stats off)
and yields the head's ``HOST:PORT``; on exit it stops exactly the processes it started, by their
group ids -- never ``ray stop``, which would stop every Ray on the machine.

``ray start`` also records its cluster in ``/tmp/ray/ray_current_cluster``, where every later
``ray.init()`` without an address (Flower's simulation runtime, for one) would try to join it --
and hang once the cluster is gone. The head therefore keeps its session files in a temporary
folder of its own, and the machine's record is put back as it was on exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

RAY = Path(sys.executable).parent / "ray"
"""The ``ray`` command of this environment (its nodes run this Python, with fairclip)."""


class ClusterError(RuntimeError):
    """A node did not start or join; the message holds the end of its log."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}


def _start_node(arguments: list[str], cpus: int, log: Path) -> subprocess.Popen:
    command = [str(RAY), "start", "--block", f"--num-cpus={cpus}", "--disable-usage-stats", *arguments]
    with log.open("w") as sink:
        return subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=_env(), start_new_session=True
        )


def stop_node(process: subprocess.Popen) -> None:
    """SIGTERM the node's process group (``ray start --block`` then stops its Ray processes),
    SIGKILL what is left after a grace period."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # the group may outlive its leader
        os.killpg(process.pid, signal.SIGKILL)


def alive_nodes(address: str) -> int:
    """How many alive nodes the cluster at ``address`` has (asked from a separate driver, so
    that this process's own Ray, if any, is left alone); 0 where it cannot be asked."""
    probe = (
        f"import ray; ray.init(address={address!r}, include_dashboard=False, log_to_driver=False); "
        "print(sum(1 for node in ray.nodes() if node['Alive'])); ray.shutdown()"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=_env(), timeout=120
        )
    except subprocess.TimeoutExpired:
        return 0
    lines = done.stdout.strip().splitlines()
    return int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else 0


@contextlib.contextmanager
def local_cluster(nodes: int = 2, cpus_per_node: int = 1, timeout: float = 120.0) -> Iterator[str]:
    """A Ray cluster of ``nodes`` nodes on 127.0.0.1; yields the head's ``HOST:PORT``. Raises
    :class:`ClusterError` (with the node's log) where ``ray start`` cannot run here."""
    if not RAY.exists():
        raise ClusterError(f"{RAY} is absent: the ray command line is not installed")
    logs = Path(tempfile.mkdtemp(prefix="fc-ray-"))  # short: Ray's socket paths live under it
    port = _free_port()
    address = f"127.0.0.1:{port}"
    head_options = [
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--include-dashboard=false",
        f"--temp-dir={logs / 'ray'}",
    ]
    record = _machine_record()
    saved = record.read_bytes() if record.is_file() else None
    started = [_start_node(head_options, cpus_per_node, logs / "head.log")]
    try:
        deadline = time.monotonic() + timeout
        while started[0].poll() is None:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if started[0].poll() is not None or time.monotonic() > deadline:
            raise ClusterError(f"ray start --head did not start: {(logs / 'head.log').read_text()[-600:]}")
        # One node at a time: two raylets starting at once on one address can pick the same free
        # port (seen with 3 nodes: "bind: Address already in use", and the node's start aborts).
        for index in range(1, nodes):
            options = [f"--address={address}", "--node-ip-address=127.0.0.1"]
            started.append(_start_node(options, cpus_per_node, logs / f"node-{index}.log"))
            while alive_nodes(address) < index + 1:
                failed = [p for p in started if p.poll() is not None]
                if failed or time.monotonic() > deadline:
                    tails = " | ".join(path.read_text()[-300:] for path in sorted(logs.glob("node-*.log")))
                    raise ClusterError(f"{nodes} nodes did not join within {timeout:g} s: {tails}")
                time.sleep(1)
        yield address
    finally:
        for process in reversed(started):
            stop_node(process)
        _restore(record, saved)


def _machine_record() -> Path:
    """The file where ``ray start`` records the latest cluster for ``ray.init()``."""
    from ray._private.utils import get_ray_address_file

    return Path(get_ray_address_file(None))


def _restore(record: Path, saved: bytes | None) -> None:
    """Put the machine's cluster record back as it was (absent where it was absent)."""
    if saved is None:
        record.unlink(missing_ok=True)
    elif not record.is_file() or record.read_bytes() != saved:
        record.write_bytes(saved)


__all__ = ["ClusterError", "alive_nodes", "local_cluster", "stop_node"]
