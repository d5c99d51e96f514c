"""Run a real Flower 1.41 deployment (SuperLink + SuperNodes) on 127.0.0.1 for tests.

A helper module for the deployment tests, not a test module. It makes throw-away TLS
certificates and SuperNode key pairs, starts `flower-superlink` with TLS and SuperNode
authentication, registers SuperNode public keys through the Control API (`flwr supernode
register`), starts `flower-supernode` processes, submits a Flower App with `flwr run`, and
stops every process it started, even when a test fails.

What Flower 1.41 does (read from its source, not from older docs):

- The SuperLink serves the Control, Fleet and Runtime (ServerAppIO) APIs over one HTTPS
  server on `--host`/`--port` (default 127.0.0.1:8000); the old gRPC ports 9091-9093 are gone
  and their flags are deprecated or rejected. TLS: `--ssl-certfile`, `--ssl-keyfile`,
  `--ssl-ca-certfile` (the CA is also used by the SuperExec that runs the ServerApp).
- SuperNode authentication: `flower-superlink --enable-supernode-auth` (TLS required); the
  SuperLink then refuses self-registration, and every SuperNode public key must be registered
  with `flwr supernode register PUBLIC_KEY CONNECTION` (Control API) before the SuperNode
  starts. `--auth-list-public-keys` is rejected by 1.41. The SuperNode gets its private key
  with `--auth-supernode-private-key` (the public key is derived from it; the old
  `--auth-supernode-public-key` is deprecated). Keys are NIST EC keys (P-384 as Flower
  generates them): private key in OpenSSH format, public key as one OpenSSH line
  (`ecdsa-sha2-nistp384 AAAA...`), what `ssh-keygen -t ecdsa -b 384` writes.
- `flwr run APP CONNECTION` reads the SuperLink connection from `$FLWR_HOME/config.toml`
  (`[superlink.CONNECTION]` with `address`, `root-certificates` (absolute path) or
  `insecure`); `[tool.flwr.federations]` in pyproject.toml is legacy and `flwr run` migrates
  it into that file and comments it out of pyproject.toml. FLWR_HOME keeps every CLI call of
  a test away from the user's ~/.flwr.
- `flwr run --run-config` merges repeated options with a shallow dict update, so dotted keys
  of one table (`federation.num_clients`, `federation.sample_rate`) must go in one string.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Environment for every Flower process: no telemetry, and no Flower process may install a
# FAB's dependencies at run time (that could pull another torch).
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "PYTHONUNBUFFERED": "1",
}

BIN_DIR = Path(sys.executable).parent
CONNECTION = "fairclip-test"

FINISHED = "finished"


# --------------------------------------------------------------------------------------------
# Certificates and keys
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    """A throw-away CA and a SuperLink server certificate signed by it (PEM files)."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKeys:
    """A SuperNode key pair: OpenSSH private key file and OpenSSH public key line file."""

    private_key: Path
    public_key: Path


def _write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def make_tls_files(
    directory: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost"), days: int = 2
) -> TlsFiles:
    """Write a CA (ca.crt, ca.key) and a server certificate (server.pem, server.key) for `hosts`.

    IP addresses among `hosts` go into the subjectAltName as IP entries, names as DNS entries.
    """
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fairclip test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    alt_names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    files = TlsFiles(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
    )
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private_key(files.ca_key, ca_key)
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_private_key(files.server_key, server_key)
    return files


def make_node_keys(directory: Path, name: str) -> NodeKeys:
    """Write a SuperNode key pair `name` (OpenSSH private key) and `name.pub` (OpenSSH line).

    P-384, the curve Flower uses; `flwr supernode register` accepts any NIST curve.
    """
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    keys = NodeKeys(private_key=directory / name, public_key=directory / f"{name}.pub")
    keys.private_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    keys.private_key.chmod(0o600)
    keys.public_key.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        + f" {name}\n".encode()
    )
    return keys


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name (field 2) may contain spaces; the parent pid follows the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (Linux /proc; empty elsewhere)."""
    if not Path("/proc").is_dir():
        return []
    children = _children_by_parent()
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class Process:
    """A process this module started, in its own process group, its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None when still running after `timeout` seconds."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


def _die_with_parent() -> None:
    """In the child before exec (Linux): get SIGTERM when the process that started it dies, so
    that a test run killed from outside leaves no SuperLink or SuperNode behind."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _signal_all(pids: Sequence[int], pgids: Sequence[int], sig: int) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_processes(processes: Sequence[Process], grace: float = 5.0) -> None:
    """SIGTERM each process group and every descendant (the SuperLink's SuperExec starts
    its own session), then SIGKILL what is left after `grace` seconds."""
    pids: list[int] = []
    pgids: list[int] = []
    for proc in processes:
        pids.extend(descendants(proc.pid))
        if proc.poll() is None:
            pids.append(proc.pid)
            pgids.append(proc.pid)  # started with start_new_session=True: pgid == pid
    _signal_all(pids, pgids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    _signal_all([pid for pid in pids if _alive(pid)], pgids, signal.SIGKILL)
    for proc in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=5)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2 :].split()[0] != "Z"


# --------------------------------------------------------------------------------------------
# Deployment
# --------------------------------------------------------------------------------------------


@dataclass
class CommandResult:
    """A finished `flwr` CLI call."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, object]:
        """The JSON object a `--format json` call printed on stdout."""
        start = self.stdout.find("{")
        if start < 0:
            raise ValueError(f"no JSON in the output of {' '.join(self.args)}:\n{self.stdout}\n{self.stderr}")
        return json.loads(self.stdout[start:])

    def __str__(self) -> str:
        return f"$ {' '.join(self.args)}\n[exit {self.returncode}]\n{self.stdout}\n{self.stderr}"


@dataclass
class RunResult:
    """A run submitted with `flwr run` and followed until it finished (or the time ran out)."""

    run_id: int | None
    status: str
    submit: CommandResult
    logs: str = ""


@dataclass
class FlowerDeployment:
    """A SuperLink and SuperNodes on 127.0.0.1, all stopped by `stop()` / leaving the `with`.

    `workdir` receives the certificates, keys, FLWR_HOME, the SuperLink database and one log
    file per process. With `tls=False` the SuperLink runs `--insecure` (and then without
    SuperNode authentication, which Flower refuses over plain text).
    """

    workdir: Path
    tls: bool = True
    supernode_auth: bool = True
    connection: str = CONNECTION
    processes: list[Process] = field(default_factory=list)
    port: int = 0
    tls_files: TlsFiles | None = None

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.flwr_home = self.workdir / "flwr-home"
        self.flwr_home.mkdir(exist_ok=True)
        self.log_dir = self.workdir / "logs"
        self.log_dir.mkdir(exist_ok=True)
        if self.tls and self.tls_files is None:
            self.tls_files = make_tls_files(self.workdir / "certs")
        if self.supernode_auth and not self.tls:
            raise ValueError("Flower refuses SuperNode authentication without TLS")

    # -- context manager ---------------------------------------------------------------------

    def __enter__(self) -> FlowerDeployment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every process this deployment started (idempotent)."""
        stop_processes(self.processes)

    # -- environment and processes -----------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(FLOWER_ENV)
        env["FLWR_HOME"] = str(self.flwr_home)
        # SuperLink and SuperNode start `flower-superexec`, which starts `flwr-serverapp` and
        # `flwr-clientapp`, by name: this interpreter's scripts must come first on PATH.
        env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
        return env

    @property
    def address(self) -> str:
        """The SuperLink's one address: Control, Fleet and Runtime API."""
        return f"127.0.0.1:{self.port}"

    def spawn(self, name: str, args: Sequence[str], cwd: Path | None = None) -> Process:
        """Start `args` in a new process group with stdout+stderr going to logs/<name>.log."""
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log_file:
            popen = subprocess.Popen(
                list(args),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=str(cwd or self.workdir),
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        proc = Process(name=name, popen=popen, log_path=log_path)
        self.processes.append(proc)
        return proc

    def flwr(self, *args: str, timeout: float = 120.0, check: bool = True) -> CommandResult:
        """Run one `flwr` CLI command against this deployment's FLWR_HOME."""
        cmd = [str(BIN_DIR / "flwr"), *args]
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                env=self.env,
                cwd=str(self.workdir),
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
            result = CommandResult(cmd, done.returncode, done.stdout, done.stderr)
        except subprocess.TimeoutExpired as err:
            out = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else err.stdout or ""
            result = CommandResult(cmd, -1, out, f"timed out after {timeout} s")
        with (self.log_dir / "flwr-cli.log").open("a") as log:
            log.write(f"{result}\n")
        if check and result.returncode != 0:
            raise RuntimeError(f"flwr command failed\n{result}\n{self.log_tail()}")
        return result

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every process log, for assertion messages."""
        parts = []
        for proc in self.processes:
            text = proc.log()
            status = proc.poll()
            parts.append(
                f"----- {proc.name} ({'running' if status is None else f'exit {status}'}) -----\n"
                + text[-chars:]
            )
        cli = self.log_dir / "flwr-cli.log"
        if cli.exists():
            parts.append("----- flwr CLI -----\n" + cli.read_text(errors="replace")[-chars:])
        return "\n".join(parts)

    # -- SuperLink ---------------------------------------------------------------------------

    def start_superlink(self, timeout: float = 60.0, extra_args: Sequence[str] = ()) -> Process:
        """Start `flower-superlink` and wait until its /health answers; write the connection."""
        self.port = free_port()
        args = [
            str(BIN_DIR / "flower-superlink"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--database",
            str(self.workdir / "superlink.db"),
            "--disable-runtime-dependency-installation",
        ]
        if self.tls:
            assert self.tls_files is not None
            args += [
                "--ssl-ca-certfile",
                str(self.tls_files.ca_cert),
                "--ssl-certfile",
                str(self.tls_files.server_cert),
                "--ssl-keyfile",
                str(self.tls_files.server_key),
            ]
        else:
            args.append("--insecure")
        if self.supernode_auth:
            args.append("--enable-supernode-auth")
        args += list(extra_args)
        proc = self.spawn("superlink", args)
        self._wait_healthy(proc, timeout)
        self.write_connection()
        return proc

    def _wait_healthy(self, proc: Process, timeout: float) -> None:
        scheme = "https" if self.tls else "http"
        context = None
        if self.tls:
            assert self.tls_files is not None
            context = ssl.create_default_context(cafile=str(self.tls_files.ca_cert))
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with {proc.poll()}\n{proc.log()}")
            try:
                with urllib.request.urlopen(f"{scheme}://{self.address}/health", context=context, timeout=2):
                    return
            except (OSError, urllib.error.URLError) as err:
                last_error = err
                time.sleep(0.3)
        raise TimeoutError(f"SuperLink not healthy after {timeout} s ({last_error})\n{proc.log()}")

    def write_connection(self) -> Path:
        """Write `[superlink.<connection>]` into $FLWR_HOME/config.toml (the 1.41 CLI config)."""
        lines = ["[superlink]", f'default = "{self.connection}"', "", f"[superlink.{self.connection}]"]
        lines.append(f'address = "{self.address}"')
        if self.tls:
            assert self.tls_files is not None
            lines.append(f'root-certificates = "{self.tls_files.ca_cert.resolve()}"')
        else:
            lines.append("insecure = true")
        path = self.flwr_home / "config.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    # -- SuperNodes --------------------------------------------------------------------------

    def register_supernode(self, keys: NodeKeys) -> int:
        """Register a SuperNode public key with the SuperLink (Control API); its node id."""
        result = self.flwr("supernode", "register", str(keys.public_key), self.connection, "--format", "json")
        return int(str(result.json()["node-id"]))

    def list_supernodes(self) -> list[dict[str, object]]:
        """`flwr supernode ls` as a list of dicts (node-id, status, ...)."""
        result = self.flwr("supernode", "ls", self.connection, "--format", "json")
        return list(result.json()["nodes"])  # type: ignore[arg-type]

    def start_supernode(
        self,
        name: str,
        *,
        keys: NodeKeys | None = None,
        node_config: Mapping[str, object] | None = None,
        insecure: bool = False,
        root_certificates: Path | None = None,
        max_retries: int | None = None,
        runtime_port: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> Process:
        """Start one `flower-supernode` (subprocess isolation unless `extra_args` says otherwise).

        It trusts the deployment's CA unless `root_certificates` names another file, or uses
        plain text with `insecure=True`. `max_retries` bounds its connection attempts (Flower
        retries forever by default). `runtime_port` is the port of its own Runtime API, where
        the ClientApp's SuperExec connects (a free port by default).
        """
        args = [
            str(BIN_DIR / "flower-supernode"),
            "--superlink",
            self.address,
            "--host",
            "127.0.0.1",
            "--port",
            str(runtime_port or free_port()),  # its own Runtime API, one port per SuperNode
        ]
        if insecure:
            args.append("--insecure")
        elif root_certificates is not None:
            args += ["--root-certificates", str(root_certificates)]
        elif self.tls_files is not None:
            args += ["--root-certificates", str(self.tls_files.ca_cert)]
        if keys is not None:
            args += ["--auth-supernode-private-key", str(keys.private_key)]
        if node_config:
            args += ["--node-config", format_node_config(node_config)]
        if max_retries is not None:
            args += ["--max-retries", str(max_retries)]
        args += list(extra_args)
        return self.spawn(name, args)

    def wait_for_nodes(self, count: int, timeout: float = 60.0) -> list[dict[str, object]]:
        """Wait until `count` SuperNodes are online; fail early when one of the SuperNodes that
        were running at the call exits."""
        deadline = time.monotonic() + timeout
        nodes: list[dict[str, object]] = []
        running = [p for p in self.processes if p.name != "superlink" and p.poll() is None]
        while time.monotonic() < deadline:
            nodes = [n for n in self.list_supernodes() if n.get("status") == "online"]
            if len(nodes) >= count:
                return nodes
            dead = [p.name for p in running if p.poll() is not None]
            if dead:
                raise RuntimeError(f"SuperNode {dead} exited before coming online\n{self.log_tail()}")
            time.sleep(1.0)
        raise TimeoutError(f"only {len(nodes)} of {count} SuperNodes online\n{self.log_tail()}")

    # -- runs --------------------------------------------------------------------------------

    def run_app(
        self, app_dir: Path, run_config: Mapping[str, object] | None = None, timeout: float = 300.0
    ) -> RunResult:
        """`flwr run APP CONNECTION` and wait until the run finished (or `timeout`)."""
        args = ["run", str(app_dir), self.connection, "--format", "json"]
        if run_config:
            # One `--run-config` string: Flower 1.41 merges repeated `--run-config` options with a
            # shallow dict update, so `-c a.x=1 -c a.y=2` would silently drop `a.x`.
            args += ["--run-config", format_run_config(run_config)]
        submit = self.flwr(*args, timeout=120, check=False)
        if submit.returncode != 0:
            return RunResult(run_id=None, status="not submitted", submit=submit)
        run_id = int(str(submit.json()["run-id"]))
        status = self.wait_for_run(run_id, timeout)
        logs = self.flwr("log", str(run_id), self.connection, "--show", timeout=60, check=False)
        return RunResult(run_id=run_id, status=status, submit=submit, logs=logs.stdout + logs.stderr)

    def run_status(self, run_id: int) -> str:
        """The run's status text, e.g. `running` or `finished:completed`."""
        result = self.flwr("ls", self.connection, "--run-id", str(run_id), "--format", "json")
        runs = result.json()["runs"]
        assert isinstance(runs, list) and runs, result
        return str(runs[0]["status"])

    def wait_for_run(self, run_id: int, timeout: float) -> str:
        """Poll until the run's status starts with `finished`; its last status."""
        deadline = time.monotonic() + timeout
        status = "unknown"
        while time.monotonic() < deadline:
            status = self.run_status(run_id)
            if status.startswith(FINISHED):
                return status
            if self.processes and self.processes[0].poll() is not None:
                return f"superlink exited ({status})"
            time.sleep(2.0)  # each poll is a `flwr` process: keep the CPU for the run
        return f"timed out ({status})"


def toml_value(value: object) -> str:
    """A Python scalar as a TOML value for `flwr run --run-config KEY=VALUE`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if "'" in text:
        return json.dumps(text)
    return f"'{text}'"


def format_run_config(config: Mapping[str, object]) -> str:
    """`--run-config` / `--node-config` value: space-separated KEY=VALUE pairs, strings quoted."""
    return " ".join(f"{key}={toml_value(value)}" for key, value in config.items())


format_node_config = format_run_config


@contextlib.contextmanager
def deployment(workdir: Path, **kwargs: object) -> Iterator[FlowerDeployment]:
    """`with deployment(tmp_path) as d:` ... every process stopped on the way out."""
    dep = FlowerDeployment(workdir, **kwargs)  # type: ignore[arg-type]
    try:
        yield dep
    finally:
        dep.stop()
