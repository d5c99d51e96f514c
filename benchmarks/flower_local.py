"""A throw-away Flower home for ``flwr run`` on Flower's local simulation runtime.

``flwr run APP local`` reads its connection from ``$FLWR_HOME/config.toml`` (Flower 1.41 writes
``[superlink.local]`` with ``address = ":local:"`` there by default) and starts a detached local
SuperLink in a session of its own, which outlives the command; the number of simulated nodes
is a per-run option, ``--federation-config "num-supernodes=N"`` (the ``options.num-supernodes``
of a connection is deprecated in 1.41). The tests and the W1 benchmark run fairclip's apps that
way: :func:`local_simulation_env` gives the environment of an isolated home (its own ports, no
telemetry, no dependency installation), :func:`write_local_simulation` its connection,
:func:`simulation_options` the per-run options, and :func:`kill_sessions_mentioning` ends what
the run left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def local_simulation_env(home: Path, binaries: Path) -> dict[str, str]:
    """The environment of ``flwr`` commands that use ``home`` as FLWR_HOME and the ``flwr``,
    ``flower-superlink`` and friends of ``binaries`` (the venv's ``bin``)."""
    return {
        **os.environ,
        "PATH": f"{binaries}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
    }


LOCAL_CONNECTION = "local"


def write_local_simulation(home: Path) -> None:
    """Make ``local`` (Flower's local simulation runtime) the default connection of ``home``."""
    name = LOCAL_CONNECTION
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = ":local:"\n'
    )


def simulation_options(num_supernodes: int) -> list[str]:
    """The ``flwr run`` options of a local simulation with ``num_supernodes`` nodes."""
    return ["--federation-config", f"num-supernodes={int(num_supernodes)}"]


def kill_sessions_mentioning(text: str) -> None:
    """Kill the process group of every process (but this one) whose command line mentions
    ``text``, such as the detached SuperLink of a run with a given FLWR_HOME."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(int(entry.name)), signal.SIGKILL)
