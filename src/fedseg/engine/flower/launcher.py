"""Start a SuperLink and one SuperNode per site on 127.0.0.1 and run a fedseg config on them.

Everything runs on loopback with free ports and a temporary ``FLWR_HOME``; telemetry, update
checks and runtime dependency installation are off. Every process is started in its own
process group and stopped through the pid this module got when it started it (SIGTERM, then
SIGKILL after a grace period); Flower's helper processes follow their parents.

Each site is one process group: fedseg's long-lived ClientApp process
(:mod:`~fedseg.engine.flower.executor`) with its SuperNode, in process isolation mode, as its
child (:func:`site_command`), so model, data and method stay loaded between messages.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fedseg.config import RunConfig
from fedseg.engine.flower.settings import FlowerSettings, SiteConfig, app_pyproject
from fedseg.engine.flower.tls import TlsFiles, write_certificates, write_node_key
from fedseg.errors import FedsegError

__all__ = [
    "LocalFederation",
    "Proc",
    "flower_env",
    "free_port",
    "process_env",
    "shown_line",
    "site_command",
    "stop_process",
    "submit_run",
    "write_connection",
]

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
CONNECTION = "fedseg"
"""Name of the SuperLink connection in the temporary ``FLWR_HOME/config.toml``."""
NODE_POLL = 0.2
"""Longest idle wait (seconds) of a loopback SuperNode before it asks for messages again."""
LOCAL_SERVER_POLL = 0.2
"""Seconds between the loopback ServerApp's polls for replies."""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CHATTER = re.compile(
    r"^(Using SuperLink: |Successfully started run |Successfully installed |Successfully built "
    r"|INFO\s*:\s*(Starting logstream for run_id|Start `flwr-serverapp` process))"
)
"""``flwr run``'s own lines about submitting and installing the app (kept in its log)."""


def shown_line(line: str) -> str | None:
    """A line of ``flwr run`` as the terminal shows it: colour codes removed (they are
    Flower's, written whether or not the output is a terminal); None for Flower's lines about
    submitting and installing the app."""
    text = _ANSI.sub("", line)
    return None if _CHATTER.match(text) else text


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def process_env() -> dict[str, str]:
    """Environment for Flower commands: this interpreter's scripts first on PATH (Flower
    starts helpers such as ``flower-superexec`` by name), telemetry and update checks off
    unless set."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def flower_env(flwr_home: Path) -> dict[str, str]:
    """:func:`process_env` with a private FLWR_HOME, telemetry and update checks off and no
    proxy for loopback."""
    env = process_env()
    no_proxy = ",".join(x for x in (env.get("NO_PROXY", ""), LOOPBACK, "localhost") if x)
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        NO_PROXY=no_proxy,
        no_proxy=no_proxy,
    )
    return env


def write_connection(flwr_home: Path, address: str, root_certificates: Path | None) -> Path:
    """``FLWR_HOME/config.toml`` with one default SuperLink connection for ``flwr``."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]"]
    lines.append(f"address = {json.dumps(address)}")
    if root_certificates is None:
        lines.append("insecure = true")
    else:
        lines.append(f"root-certificates = {json.dumps(str(Path(root_certificates).resolve()))}")
    path = flwr_home / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def site_command(
    supernode_argv: Sequence[str], runtime_port: int, poll: float | None = None
) -> list[str]:
    """The command of one site: fedseg's long-lived ClientApp process serving the SuperNode
    ``supernode_argv`` (``flower-supernode ...``, whose Runtime API listens on
    127.0.0.1:``runtime_port``), which it starts in process isolation mode; ``poll`` caps the
    SuperNode's idle waits (:mod:`~fedseg.engine.flower.supernode`; None: Flower's own)."""
    node = list(supernode_argv)
    if poll is not None:
        node[:1] = [sys.executable, "-m", "fedseg.engine.flower.supernode", str(poll)]
    return [
        sys.executable, "-m", "fedseg.engine.flower.executor",
        "--runtime-api-address", f"{LOOPBACK}:{runtime_port}", "--", *node,
    ]  # fmt: skip


@dataclass
class Proc:
    """A process this module started (its own process group) and its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None


def spawn(name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> Proc:
    """Start ``argv`` in a new session with output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as fh:
        popen = subprocess.Popen(
            list(argv),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,
        )
    log.debug("started %s (pid %d): %s", name, popen.pid, " ".join(argv))
    return Proc(name, popen, log_path)


def stop_process(proc: Proc, sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
    """Signal the process group led by ``proc`` (only while its leader runs), then SIGKILL
    the group if it has not exited after ``grace`` seconds."""
    if not proc.alive():
        return
    try:
        os.killpg(proc.pid, sig)
        proc.popen.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        if proc.alive():
            os.killpg(proc.pid, signal.SIGKILL)
        proc.popen.wait(timeout=grace)
    except ProcessLookupError:
        pass


def _wait_listening(proc: Proc, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise FedsegError(f"{proc.name} exited during start-up; see {proc.log}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex((LOOPBACK, port)) == 0:
                return
        time.sleep(0.2)
    raise FedsegError(f"{proc.name} did not listen on {LOOPBACK}:{port} within {timeout:.0f}s")


def submit_run(
    cfg: RunConfig,
    settings: FlowerSettings,
    app_dir: Path,
    env: Mapping[str, str],
    on_line: Callable[[str], None] | None = None,
    timeout: float | None = None,
    connection: str = CONNECTION,
) -> int:
    """``flwr run APP <connection> --stream`` for ``cfg``; lines go to ``on_line``. Returns
    the exit code of ``flwr run`` (the run's success is its ``results.json``)."""
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "pyproject.toml").write_text(app_pyproject(cfg, settings))
    argv = ["flwr", "run", str(app_dir), connection, "--stream"]
    popen = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(env),
        start_new_session=True,
    )
    proc = Proc("flwr run", popen, app_dir / "flwr-run.log")
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        assert popen.stdout is not None
        _pump(popen.stdout, proc.log, on_line, popen, deadline)
        return popen.wait(timeout=30)
    finally:
        stop_process(proc, grace=5)


def _pump(
    stream: IO[bytes],
    log_path: Path,
    on_line: Callable[[str], None] | None,
    popen: subprocess.Popen[bytes],
    deadline: float | None,
) -> None:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    with log_path.open("ab") as fh:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise FedsegError(f"the Flower run did not finish in time; see {log_path}")
            if not sel.select(timeout=1.0):
                if popen.poll() is not None:
                    return
                continue
            line = stream.readline()
            if not line:
                return
            fh.write(line)
            fh.flush()
            shown = shown_line(line.decode(errors="replace").rstrip())
            if on_line is not None and shown is not None:
                on_line(shown)


class LocalFederation:
    """A SuperLink and one SuperNode per site on loopback.

    Use as a context manager; every process it started is stopped on exit. ``tls`` serves
    the SuperLink over TLS with a certificate made for 127.0.0.1; ``auth`` additionally
    enables SuperNode authentication with one registered key per site (named after it).
    ``node_poll`` caps the SuperNodes' idle waits (seconds; None: Flower's 3 s).
    """

    def __init__(
        self,
        sites: Sequence[SiteConfig],
        workdir: Path,
        *,
        tls: bool = False,
        auth: bool = False,
        log_dir: Path | None = None,
        node_poll: float | None = NODE_POLL,
    ) -> None:
        if auth and not tls:
            raise FedsegError("SuperNode authentication needs TLS (tls=True)")
        self.sites = {s.name: s for s in sites}
        self.workdir = Path(workdir)
        self.log_dir = Path(log_dir) if log_dir else self.workdir / "logs"
        self.tls, self.auth, self.node_poll = tls, auth, node_poll
        self.flwr_home = self.workdir / "flwr-home"
        self.env = flower_env(self.flwr_home)
        self.port = 0
        self.certs: TlsFiles | None = None
        self.keys: dict[str, Path] = {}
        self.superlink: Proc | None = None
        self.supernodes: dict[str, Proc] = {}
        self._nodes: list[Proc] = []
        """Every SuperNode this object started, current or not."""

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def __enter__(self) -> LocalFederation:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _security_args(self) -> list[str]:
        if self.certs is None:
            return ["--insecure"]
        return [
            "--ssl-ca-certfile", str(self.certs.ca),
            "--ssl-certfile", str(self.certs.cert),
            "--ssl-keyfile", str(self.certs.key),
        ]  # fmt: skip

    def start(self, timeout: float = 90.0) -> None:
        """Start the SuperLink, register the site keys (``auth``), start every SuperNode."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.tls:
            self.certs = write_certificates(self.workdir / "tls", (LOOPBACK, "localhost"))
        self.port = free_port()
        write_connection(self.flwr_home, self.address, self.certs.ca if self.certs else None)
        argv = [
            "flower-superlink", *self._security_args(), "--host", LOOPBACK,
            "--port", str(self.port), "--disable-runtime-dependency-installation",
        ]  # fmt: skip
        if self.auth:
            argv.append("--enable-supernode-auth")
        self.superlink = spawn("SuperLink", argv, self.env, self.log_dir / "superlink.log")
        _wait_listening(self.superlink, self.port, timeout)
        for name in self.sites:
            if self.auth:
                self.keys[name] = self.register_key(name)
            self.start_site(name)

    def register_key(self, name: str, register_as: str | None = None) -> Path:
        """Create a key pair for site ``name`` and register its public key on the SuperLink
        under ``register_as`` (default: the site name)."""
        key, pub = write_node_key(self.workdir / "keys" / name)
        out = subprocess.run(
            ["flwr", "supernode", "register", str(pub), CONNECTION, "--name", register_as or name],
            env=self.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if out.returncode != 0:
            raise FedsegError(
                f"registering the key of site {name!r} failed: {out.stdout}{out.stderr}"
            )
        return key

    def start_site(self, name: str, key: Path | None = None) -> Proc:
        """(Re)start the SuperNode of site ``name``."""
        old = self.supernodes.get(name)
        if old is not None:
            stop_process(old)
        proc = self.start_node(f"site-{name}", self.sites[name], key or self.keys.get(name))
        self.supernodes[name] = proc
        return proc

    def start_node(self, label: str, site: SiteConfig, key: Path | None = None) -> Proc:
        """Start a SuperNode with ``site``'s node config (stopped by :meth:`stop`)."""
        security = ["--root-certificates", str(self.certs.ca)] if self.certs else ["--insecure"]
        port = free_port()
        argv = [
            "flower-supernode", *security, "--superlink", self.address, "--host", LOOPBACK,
            "--port", str(port), "--node-config", site.to_node_config(),
        ]  # fmt: skip
        if key is not None:
            argv += ["--auth-supernode-private-key", str(key)]
        command = site_command(argv, port, self.node_poll)
        proc = spawn(f"SuperNode {label}", command, self.env, self.log_dir / f"{label}.log")
        self._nodes.append(proc)
        return proc

    def kill_site(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Crash (SIGKILL) or stop (SIGTERM) the SuperNode of ``name`` and its helpers."""
        stop_process(self.supernodes[name], sig=sig)

    def run(
        self,
        cfg: RunConfig,
        settings: FlowerSettings,
        on_line: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Submit ``cfg`` and stream its log; return ``results.json`` of the finished run."""
        results = Path(settings.run_dir) / "results.json"
        before = results.stat().st_mtime if results.exists() else None
        code = submit_run(cfg, settings, self.workdir / "app", self.env, on_line, timeout)
        if not results.exists() or results.stat().st_mtime == before:
            raise FedsegError(
                f"the Flower run ended (flwr exit code {code}) without results; see "
                f"{Path(settings.run_dir) / 'run.log'} and the logs in {self.log_dir}"
            )
        return json.loads(results.read_text())

    def stop(self) -> None:
        """Stop every SuperNode, then the SuperLink (each by the pid it was started with)."""
        for proc in self._nodes:
            stop_process(proc)
        if self.superlink is not None:
            stop_process(self.superlink)
