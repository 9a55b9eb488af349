"""The local lab fleet: N engine replicas behind HAProxy, supervised by supervisord.

Layout of ``state_dir`` (nothing is written outside it, apart from the lab's cgroups)::

    lab.json                 url, ports, pids, cgroup paths, engine (read by :meth:`Lab.attach`)
    supervisord.conf/.log    supervisord configuration and its own log (exit statuses)
    supervisor.sock          supervisord XML-RPC (unix socket)
    haproxy.cfg, haproxy.sock  HAProxy configuration and admin stats socket
    haproxy-requests.log     one line per request through HAProxy (ground truth, any engine)
    ledger.jsonl             engine ledger, shared by every replica (ground truth, sim engine)
    events.jsonl             start / ready / exit / fault records (ground truth)
    faults.json              active faults: the rollback ledger (every kind, see add_fault)
    admin-token              per-lab random token of the sim engines' fault control plane
                             (mode 0600; the state directory itself is made 0700)
    placement.json           replica -> node (labs with nodes; see chaoslib_infer.lab.nodes)
    logs/                    replica, HAProxy stderr and recorder logs

Process tree: ``supervisord`` (in cgroup ``ctl``) supervises every replica (``cgexec`` moves
each into its own memory-limited cgroup ``rN`` and execs the engine, so restarts rejoin it),
HAProxy in the foreground, and the recorder (event listener writing ``events.jsonl``).
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import secrets
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab import procfs
from chaoslib_infer.lab.cgroups import (
    CgroupError,
    MemoryCgroup,
    detect_hierarchy,
    kill_tree,
    remove_tree,
)
from chaoslib_infer.lab.hog import HOG_MODULE
from chaoslib_infer.lab.recorder import EVENTS_FILE, SUPERVISORD_LOG, append_event, read_events
from chaoslib_infer.safety.redact import child_env

__all__ = ["ENGINES", "Lab", "LabError", "engine_command", "register_engine"]

LAB_FILE = "lab.json"
FAULTS_FILE = "faults.json"
LEDGER_FILE = "ledger.jsonl"
REQUEST_LOG = "haproxy-requests.log"
SUPERVISOR_SOCK = "supervisor.sock"
HAPROXY_SOCK = "haproxy.sock"
#: the sim engines' admin token (``--admin-token-file``; see :meth:`Lab.admin_token`)
ADMIN_TOKEN_FILE = "admin-token"
#: fields of a fault record copied into its ``injected`` ground-truth event (never secrets)
_EVENT_FIELDS = ("mode", "node", "port", "host")
MAX_REPLICAS = 32
#: dead-man TTL of a fault record without ``ttl_s`` (seconds; see chaoslib_infer.safety.deadman)
DEFAULT_FAULT_TTL_S = 120.0
MIN_MEMORY_MB = 32
TICK_S = 0.02  # supervisord wake-up period (see recorder.tick_forever)
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
#: files of a non-HAProxy gateway (:mod:`chaoslib_infer.lab.gateways`), removed at lab up
_GATEWAY_FILES = (
    "gateway.json", "gateway-requests.log", "gateway-servers.json", "gateway-sync.jsonl",
    "haproxy-wire.log", "nginx.conf", "nginx.conf.new", "nginx.pid", "ttft.jsonl",
)  # fmt: skip


class LabError(InferChaosError):
    """Every expected lab failure; the message is one line."""


# --------------------------------------------------------------------------------------------
# Engine commands (pluggable: the llama.cpp engine registers "llama-cpp")
# --------------------------------------------------------------------------------------------
EngineBuilder = Callable[[str, int, Path, dict[str, object]], list[str]]


def _cli_args(engine_args: dict[str, object]) -> list[str]:
    """``{"load_delay_s": 1.0, "zero_latency": True}`` -> ``["--load-delay-s", "1.0", "--zero-latency"]``."""
    out: list[str] = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-").lstrip("-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            for item in value:
                out += [flag, str(item)]
        else:
            out += [flag, str(value)]
    return out


def _sim_command(
    replica: str, port: int, ledger: Path, engine_args: dict[str, object]
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "chaoslib_infer.lab.engine",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--replica-id",
        replica,
        "--ledger",
        str(ledger),
        *_cli_args(engine_args),
    ]


ENGINES: dict[str, EngineBuilder] = {"sim": _sim_command}
HEALTH_PATHS: dict[str, str] = {"sim": "/health"}


def register_engine(name: str, builder: EngineBuilder, health_path: str = "/health") -> None:
    """Make ``engine=name`` available to :meth:`Lab.up`.

    Args:
        name: engine name (``Lab.up(engine=name)``, ``Lab.engine_name()``).
        builder: ``builder(replica, port, ledger, engine_args) -> argv``; the server must listen
            on 127.0.0.1:``port``.
        health_path: GET path answering 200 once the replica serves (HAProxy ``httpchk``,
            readiness, the recorder's ``ready`` event).
    """
    ENGINES[name] = builder
    HEALTH_PATHS[name] = health_path


def _register_builtin_engines() -> None:
    """Register ``llama-cpp`` from :mod:`chaoslib_infer.lab.llama` when that module exists."""
    if "llama-cpp" in ENGINES:
        return
    try:
        from chaoslib_infer.lab import llama
    except ImportError:
        return
    register_engine("llama-cpp", llama.llama_engine_command, llama.READINESS_PATH)


def health_path(engine: str) -> str:
    """GET path that answers 200 when a replica of ``engine`` is ready."""
    _register_builtin_engines()
    return HEALTH_PATHS.get(engine, "/health")


def engine_command(
    engine: str,
    replica: str,
    port: int,
    ledger: Path,
    engine_args: dict[str, object] | None = None,
) -> list[str]:
    """argv of one replica's engine server listening on 127.0.0.1:``port``.

    Raises:
        LabError: unknown engine.
    """
    _register_builtin_engines()
    builder = ENGINES.get(engine)
    if builder is None:
        raise LabError(f"unknown engine {engine!r}; known: {', '.join(sorted(ENGINES))}")
    try:
        return builder(replica, port, ledger, dict(engine_args or {}))
    except LabError:
        raise
    except (RuntimeError, OSError, ValueError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LabError(f"engine {engine!r}: {first}") from exc


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------
class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__()
        self._path = path
        self._timeout = timeout

    def make_connection(self, host: Any) -> http.client.HTTPConnection:
        return _UnixHTTPConnection(self._path, self._timeout)


def _rpc(state_dir: Path, timeout_s: float = 5.0) -> Any:
    """supervisord XML-RPC proxy over the lab's unix socket."""
    transport = _UnixTransport(str(state_dir / SUPERVISOR_SOCK), timeout_s)
    return xmlrpc.client.ServerProxy("http://localhost/RPC2", transport=transport)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _http_status(
    port: int, path: str = "/health", timeout_s: float = 0.5, host: str = "127.0.0.1"
) -> int | None:
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _alive(pid: int | None) -> bool:
    """True if ``pid`` runs (zombies count as dead; our own zombies are reaped)."""
    if not pid:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _wait_dead(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _tail(path: Path, lines: int = 1) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(ln.strip() for ln in text[-lines:])


def _write_json(path: Path, data: Any) -> None:
    """Durable atomic write: temporary sibling, fsync, rename, fsync of the directory.

    A reader (or a process killed mid-write) sees either the old or the new file, never half of
    one; after return the new content survives a machine crash (faults.json is the rollback ledger).
    """
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, indent=2) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


#: sim engine flags the lab sets itself (an ``engine_args`` key for one is refused)
_LAB_SET_ARGS = ("host", "port", "replica_id", "ledger", "admin_token_file")


def _check_sim_args(engine_args: dict[str, object], argv: list[str]) -> None:
    """Refuse sim ``engine_args`` the engine would reject, before anything starts.

    Raises:
        LabError: a key the lab sets itself, an unknown flag or a bad value (one line).
    """
    taken = [k for k in engine_args if str(k).replace("-", "_").lstrip("_") in _LAB_SET_ARGS]
    if taken:
        raise LabError(f"engine_args: {taken[0]!r} is set by the lab, not by engine_args")
    from chaoslib_infer.lab import engine as sim

    try:
        sim.check_args(argv[argv.index("chaoslib_infer.lab.engine") + 1 :])
    except ValueError as exc:
        raise LabError(f"engine_args {engine_args}: {exc}") from None


def _write_secret(path: Path, value: str) -> None:
    """Write ``value`` to a new file readable by its owner only (mode 0600 from creation)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(value + "\n")


def _conf_value(argv: list[str]) -> str:
    """A command line for supervisord.conf (shell-quoted, ``%`` escaped for its interpolation)."""
    return shlex.join(argv).replace("%", "%%")


_SUPERVISORD_CONF = """\
; Generated by chaoslib_infer.lab.fleet for lab {lab_id}; do not edit.
[unix_http_server]
file={sock}
chmod=0700

[supervisord]
logfile={log}
logfile_maxbytes=0
loglevel=info
pidfile={pidfile}
nodaemon=true
silent=true
childlogdir={logs}
identifier=chaos-infer-{lab_id}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{sock}

[eventlistener:recorder]
command={recorder}
events=PROCESS_STATE
buffer_size=1024
priority=1
autorestart=true
startsecs=0
stopwaitsecs=2
stderr_logfile={logs}/recorder.err
stderr_logfile_maxbytes=0

[program:ticker]
command={ticker}
priority=1
autorestart=true
startsecs=0
stopwaitsecs=1
stdout_logfile=NONE
stderr_logfile=NONE

[program:watchdog]
command={watchdog}
priority=2
autorestart=true
startsecs=0
stopwaitsecs=2
redirect_stderr=true
stdout_logfile={logs}/watchdog.log
stdout_logfile_maxbytes=0

[program:haproxy]
command={haproxy}
priority=5
autorestart=true
startsecs=0
startretries=3
stopsignal=TERM
stopwaitsecs=2
stdout_logfile={request_log}
stdout_logfile_maxbytes=0
stderr_logfile={logs}/haproxy.err
stderr_logfile_maxbytes=0
{programs}"""

_PROGRAM = """
[program:{name}]
command={command}
priority=10
autostart=true
autorestart=true
startsecs=0
startretries=3
stopsignal=TERM
stopwaitsecs=2
stopasgroup=true
killasgroup=true
redirect_stderr=true
stdout_logfile={logs}/{name}.log
stdout_logfile_maxbytes=0
"""


# --------------------------------------------------------------------------------------------
# The lab
# --------------------------------------------------------------------------------------------
class Lab:
    """Handle on a running (or stopped) lab in ``state_dir``; see the module docstring."""

    state_dir: Path

    def __init__(self, state_dir: Path, meta: dict[str, Any]) -> None:
        """Wrap an existing lab; use :meth:`up` or :meth:`attach` instead."""
        self.state_dir = state_dir
        self.meta = meta
        self._proc: subprocess.Popen[bytes] | None = None

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def up(
        cls,
        state_dir: Path,
        replicas: int = 3,
        engine: str = "sim",
        port: int = 0,
        memory_limit_mb: int = 512,
        engine_args: dict[str, object] | None = None,
        ready_timeout_s: float = 60.0,
        standby: int = 0,
        autoscale: bool = False,
        scale_out_queue: float = 4.0,
        scale_out_after_s: float = 1.0,
        scale_out_cooldown_s: float = 10.0,
        nodes: int | None = None,
        spare_node: bool | None = None,
        gateway_retry: bool = False,
        gateway: str = "haproxy",
        gateway_config: str | Path | None = None,
    ) -> Lab:
        """Start a lab and wait until every replica is ready and HAProxy answers.

        ``standby`` replicas are configured but not started (supervisord ``autostart=false``,
        HAProxy server in maintenance); ``autoscale`` runs the scale-out policy over them, with
        ``scale_out_queue`` (queue depth, requests), ``scale_out_after_s`` and
        ``scale_out_cooldown_s`` (seconds): see :mod:`chaoslib_infer.lab.scaling`.

        ``nodes=N`` (N >= 1) groups the replicas round-robin into N nodes, each a network
        namespace, plus one empty spare node unless ``spare_node`` is False (see
        :mod:`chaoslib_infer.lab.nodes`); ``None``/0 keeps every replica on loopback.

        ``gateway_retry=True`` makes HAProxy retry a request that a replica refused or answered
        503 (before any generation) on another replica, redispatching on every retry (``retry-on
        conn-failure 503``, ``retries 3``, ``option redispatch 1``), and eject a replica at its
        first connection error (``observe layer7 error-limit 1 on-error mark-down``, ``fastinter
        100ms``); the default gateway relies on its health checks alone (``inter 500ms fall 2``),
        so a restarted replica that is still loading answers 503s to clients until it is DOWN.

        ``gateway`` is the process on the lab's URL: ``haproxy`` (the above) or ``nginx`` with
        ``gateway_config`` (the user's nginx.conf, server blocks or location snippet, a Jinja2
        template over the lab's replicas; None: the project's default), HAProxy then running off
        the client path as the lab's intent plane: see :mod:`chaoslib_infer.lab.gateways`.

        Raises:
            LabError: bad arguments, missing HAProxy, no memory cgroup, lab already running in
                ``state_dir``, or not ready in time (everything started is torn down first);
                with nodes: ``ip`` missing or network namespaces not permitted.
        """
        if not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
            raise LabError(f"replicas must be between 1 and {MAX_REPLICAS}, got {replicas!r}")
        if not 0 <= int(port) <= 65535:
            raise LabError(f"port must be 0..65535, got {port}")
        if memory_limit_mb < MIN_MEMORY_MB:
            raise LabError(
                f"memory_limit_mb must be at least {MIN_MEMORY_MB}, got {memory_limit_mb}"
            )
        if ready_timeout_s <= 0:
            raise LabError(f"ready_timeout_s must be positive, got {ready_timeout_s}")
        from chaoslib_infer.lab import scaling

        scaling_meta = scaling.scaling_options(
            replicas, standby, autoscale, scale_out_queue, scale_out_after_s,
            scale_out_cooldown_s, MAX_REPLICAS,
        )  # fmt: skip
        state_dir = Path(state_dir).resolve()
        ledger = state_dir / LEDGER_FILE
        sample_argv = engine_command(engine, "r0", 1, ledger, engine_args)  # validates the name
        if engine == "sim":
            _check_sim_args(engine_args or {}, sample_argv)
        from chaoslib_infer.lab import nodes as lab_nodes

        n_nodes, spare = lab_nodes.validate_nodes(nodes, spare_node, sample_argv)
        haproxy_bin = hap.find_haproxy()
        if haproxy_bin is None:
            raise LabError("haproxy not found: apt-get install haproxy")
        from chaoslib_infer.lab import gateways as lab_gateways

        try:
            lab_gateways.precheck(gateway, gateway_config, [f"r{i}" for i in range(replicas)])
        except lab_gateways.GatewayError as exc:
            raise LabError(str(exc)) from None
        state_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # the admin token and the fault ledger live here
            os.chmod(state_dir, 0o700)
        if (state_dir / LAB_FILE).exists():
            old = cls(state_dir, json.loads((state_dir / LAB_FILE).read_text()))
            if old._supervisord_alive():
                raise LabError(f"a lab is already running in {state_dir}; run down first")
            old.down()
        try:
            hierarchy = detect_hierarchy()
        except CgroupError as exc:
            raise LabError(str(exc)) from exc

        if port == 0:
            port = _free_port()
        elif not _port_free(port):
            raise LabError(f"port {port} on 127.0.0.1 is already in use")
        ports: list[int] = []
        while len(ports) < replicas + standby + (gateway != "haproxy"):
            p = _free_port()
            if p != port and p not in ports:
                ports.append(p)

        for name in (
            EVENTS_FILE,
            LEDGER_FILE,
            REQUEST_LOG,
            SUPERVISORD_LOG,
            FAULTS_FILE,
            "supervisord.out",
            scaling.QUEUE_SAMPLES,
            "placement.json",
            ADMIN_TOKEN_FILE,
            *_GATEWAY_FILES,
        ):
            with contextlib.suppress(FileNotFoundError):
                (state_dir / name).unlink()
        _write_secret(state_dir / ADMIN_TOKEN_FILE, secrets.token_hex(32))
        (state_dir / "logs").mkdir(exist_ok=True)
        for log in (state_dir / "logs").glob("*"):
            with contextlib.suppress(OSError):
                log.unlink()

        lab_id = secrets.token_hex(4)
        root = hierarchy.base / f"chaos-infer-{lab_id}"
        names = [f"r{i}" for i in range(replicas + standby)]
        meta: dict[str, Any] = {
            "lab_id": lab_id,
            "state_dir": str(state_dir),
            "url": f"http://127.0.0.1:{port}",
            "port": port,
            "engine": engine,
            "engine_args": dict(engine_args or {}),
            "health_path": health_path(engine),
            "gateway_retry": bool(gateway_retry),
            "gateway": gateway,
            "gateway_info": {
                "config_path": str(Path(gateway_config).resolve()) if gateway_config else None
            },
            **({"haproxy_port": ports.pop()} if gateway != "haproxy" else {}),
            "memory_limit_bytes": memory_limit_mb << 20,
            "cgroup_version": hierarchy.version,
            "cgroup_root": str(root),
            "ctl_cgroup": str(root / "ctl"),
            "replicas": [
                {
                    "name": n,
                    "port": p,
                    "cgroup": str(root / n),
                    **({"standby": True} if i >= replicas else {}),
                }
                for i, (n, p) in enumerate(zip(names, ports, strict=True))
            ],
            "scaling": scaling_meta,
            "pids": {},
            "started_at": time.time(),
            "ready_at": None,
            "down_at": None,
        }
        lab = cls(state_dir, meta)
        try:
            if n_nodes:
                lab_nodes.plan_nodes(meta, n_nodes, spare)
            lab._start(haproxy_bin)
            lab._wait_ready(ready_timeout_s)
            if gateway != "haproxy":  # the first-token gap without the gateway (figures)
                first = meta["replicas"][0]
                lab_gateways.calibrate(state_dir, lab.replica_host(first["name"]), first["port"])
        except BaseException as exc:
            with contextlib.suppress(Exception):
                lab.down()
            if isinstance(exc, LabError):
                raise
            if isinstance(exc, CgroupError | OSError):
                raise LabError(f"lab failed to start: {exc}") from exc
            raise
        return lab

    def _start(self, haproxy_bin: str) -> None:
        meta, sd = self.meta, self.state_dir
        version = int(meta["cgroup_version"])
        MemoryCgroup(Path(meta["cgroup_root"]), version).create()
        MemoryCgroup(Path(meta["ctl_cgroup"]), version).create()
        for rep in meta["replicas"]:
            MemoryCgroup(Path(rep["cgroup"]), version).create(int(meta["memory_limit_bytes"]))
        _write_json(sd / LAB_FILE, meta)

        cfg = sd / "haproxy.cfg"
        from chaoslib_infer.lab import scaling

        cfg.write_text(
            scaling.mark_standby_servers(
                hap.render_config(
                    meta["lab_id"],
                    int(meta.get("haproxy_port") or meta["port"]),
                    [(r["name"], int(r["port"])) for r in meta["replicas"]],
                    sd / HAPROXY_SOCK,
                    health_path=self._health_path(),
                    retry_elsewhere=bool(meta.get("gateway_retry")),
                ),
                [r["name"] for r in meta["replicas"] if r.get("standby")],
            )
        )
        lab_nodes: Any = None
        if meta.get("nodes"):  # namespaces first; replicas on nodes listen on the node address
            from chaoslib_infer.lab import nodes as lab_nodes

            lab_nodes.setup_nodes(self)
            hosts = {r["name"]: (r["host"], int(r["port"])) for r in meta["replicas"]}
            cfg.write_text(lab_nodes.haproxy_config(cfg.read_text(), hosts))
        check = subprocess.run(
            [haproxy_bin, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True, timeout=10
        )
        if check.returncode != 0:
            first = (check.stderr or check.stdout).strip().splitlines()[:1]
            raise LabError(f"haproxy rejected {cfg}: {first[0] if first else check.returncode}")

        programs = []
        request_log = sd / REQUEST_LOG
        if meta.get("gateway", "haproxy") != "haproxy":  # nginx on the lab's URL, HAProxy beside
            from chaoslib_infer.lab import gateways as lab_gateways
            from chaoslib_infer.lab.gateways import nginx as lab_nginx

            servers = [
                {"name": r["name"], "addr": f"{self.replica_host(r['name'])}:{r['port']}"}
                for r in meta["replicas"]
                if not r.get("standby")
            ]
            try:
                programs.append(lab_gateways.start_programs(sd, servers, sys.executable))
            except InferChaosError as exc:
                raise LabError(str(exc)) from None
            path = meta["gateway_info"].get("config_path")
            lab_gateways.record(sd, meta["gateway"], path, Path(path).read_text() if path else None)
            request_log = sd / "haproxy-wire.log"  # HAProxy off the client path: health checks
            (sd / lab_nginx.ACCESS_LOG).touch()
            (sd / REQUEST_LOG).symlink_to(lab_nginx.ACCESS_LOG)
        engine_args = dict(meta["engine_args"])
        if meta["engine"] == "sim":  # the fault control plane answers the lab's token only
            engine_args["admin_token_file"] = str(sd / ADMIN_TOKEN_FILE)
            if meta.get("gateway", "haproxy") != "haproxy":  # stream buffering (gateways)
                engine_args.setdefault("ttft_log", str(sd / "ttft.jsonl"))
        for rep in meta["replicas"]:
            cmd = engine_command(
                meta["engine"], rep["name"], int(rep["port"]), sd / LEDGER_FILE, engine_args
            )
            wrapped = [
                sys.executable,
                "-m",
                "chaoslib_infer.lab.cgexec",
                "--cgroup",
                rep["cgroup"],
                "--",
                *cmd,
            ]
            if lab_nodes is not None:  # cgroup, then the node's namespace, then the engine
                wrapped = lab_nodes.program_command(sd, rep, cmd)
            block = _PROGRAM.format(
                name=rep["name"], command=_conf_value(wrapped), logs=sd / "logs"
            )
            if rep.get("standby"):  # configured, started by the autoscaler or a drill
                block = block.replace("autostart=true", "autostart=false")
            programs.append(block)
        programs.append(
            scaling.supervisor_program(
                meta,
                sd,
                [sys.executable, "-m", "chaoslib_infer.lab.scaling", "--state-dir", str(sd)],
            )
        )
        conf = sd / "supervisord.conf"
        conf.write_text(
            _SUPERVISORD_CONF.format(
                lab_id=meta["lab_id"],
                sock=sd / SUPERVISOR_SOCK,
                log=sd / SUPERVISORD_LOG,
                pidfile=sd / "supervisord.pid",
                logs=sd / "logs",
                recorder=_conf_value(
                    [sys.executable, "-m", "chaoslib_infer.lab.recorder", "--state-dir", str(sd)]
                ),
                ticker=_conf_value(
                    [sys.executable, "-m", "chaoslib_infer.lab.recorder", "--tick-s", f"{TICK_S:g}"]
                ),
                watchdog=_conf_value(
                    [sys.executable, "-m", "chaoslib_infer.safety.deadman", "--state-dir", str(sd)]
                ),
                haproxy=_conf_value([haproxy_bin, "-db", "-f", str(cfg)]),
                request_log=request_log,
                programs="".join(programs),
            )
        )
        env = child_env()  # lab children never get the API key
        env["PYTHONPATH"] = os.pathsep.join(
            [_PACKAGE_PARENT, *filter(None, [env.get("PYTHONPATH")])]
        )
        env["PYTHONUNBUFFERED"] = "1"
        with open(sd / "supervisord.out", "ab") as out:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "chaoslib_infer.lab.cgexec",
                    "--cgroup",
                    meta["ctl_cgroup"],
                    "--",
                    sys.executable,
                    "-m",
                    "supervisor.supervisord",
                    "-c",
                    str(conf),
                ],
                cwd=sd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        meta["pids"] = {"supervisord": self._proc.pid}
        _write_json(sd / LAB_FILE, meta)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        sd = self.state_dir
        problem: str | None = "supervisord not answering"
        while time.monotonic() < deadline:
            if not self._supervisord_alive():
                if self._proc is not None and self._proc.poll() is None:
                    # still running: cgexec is exec'ing supervisord (cmdline briefly empty)
                    time.sleep(0.02)
                    continue
                detail = _tail(sd / "supervisord.out") or _tail(sd / SUPERVISORD_LOG)
                raise LabError(f"supervisord exited during start: {detail or 'no output'}")
            problem = self._not_ready_reason()
            if problem is None:
                self.meta["ready_at"] = time.time()
                self.meta["pids"] = self._pids()
                _write_json(sd / LAB_FILE, self.meta)
                return
            if problem.startswith("FATAL:"):
                raise LabError(problem[6:])
            time.sleep(0.02)
        raise LabError(f"lab not ready within {timeout_s:g} s: {problem}")

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Block until every replica is ready and HAProxy sees it UP (between drills).

        Raises:
            LabError: not healthy within ``timeout_s`` seconds (message says what is not ready).
        """
        deadline = time.monotonic() + timeout_s
        problem: str | None = "unknown"
        while time.monotonic() < deadline:
            problem = self._not_ready_reason()
            if problem is None:
                return
            time.sleep(0.05)
        raise LabError(
            f"lab not healthy within {timeout_s:g} s: {(problem or '').removeprefix('FATAL:')}"
        )

    def _not_ready_reason(self) -> str | None:
        """None when ready, else why not (``FATAL:`` prefix = give up now)."""
        sd = self.state_dir
        try:
            infos = {p["name"]: p for p in _rpc(sd, 1.0).supervisor.getAllProcessInfo()}
        except (OSError, xmlrpc.client.Error, http.client.HTTPException):
            return "supervisord not answering"
        gateway = ["gateway"] if self.meta.get("gateway", "haproxy") != "haproxy" else []
        for name in [*self.replica_names(), "haproxy", *gateway]:
            info = infos.get(name)
            if info is None:
                return f"{name} unknown to supervisord"
            if info["statename"] in ("FATAL", "BACKOFF") or (
                name in ("haproxy", "gateway") and info["statename"] == "EXITED"
            ):
                log = sd / "logs" / ("haproxy.err" if name == "haproxy" else f"{name}.log")
                if name == "gateway":
                    log = sd / "logs" / "nginx.err"
                return f"FATAL:{name} failed to start ({info['statename']}): {_tail(log) or info['spawnerr']}"
            if info["statename"] != "RUNNING":
                return f"{name} is {info['statename']}"
        exits: dict[str, list[dict[str, Any]]] = {}
        for ev in self.events():
            if ev.get("event") == "exit" and not ev.get("expected"):  # not a supervisord stop
                exits.setdefault(ev["replica"], []).append(ev)
        ready_at = self.meta.get("ready_at")
        for name, evs in exits.items():
            if ready_at:  # after start-up, drills kill replicas on purpose: only a fast loop counts
                evs = [e for e in evs if float(e.get("t", 0)) > time.time() - 15.0]
            if len(evs) >= 3:
                last = _tail(sd / "logs" / f"{name}.log")
                return f"FATAL:{name} keeps exiting ({evs[-1]['cause']}): {last or 'no output'}"
        for rep in self.meta["replicas"]:
            if rep.get("standby"):
                continue
            host = self.replica_host(rep["name"])
            if _http_status(int(rep["port"]), self._health_path(), host=host) != 200:
                return f"{rep['name']} {self._health_path()} not 200 (log: {_tail(sd / 'logs' / (rep['name'] + '.log')) or 'empty'})"
        try:
            stats = hap.show_stat(sd / HAPROXY_SOCK)
        except OSError:
            return "haproxy stats socket not answering"
        down = [
            n
            for n in self.replica_names()
            if not stats.get(n, {}).get("status", "").startswith("UP")
        ]
        if down:
            return f"haproxy has {', '.join(down)} not UP yet"
        if _http_status(int(self.meta["port"]), self._health_path()) != 200:
            return f"haproxy frontend not answering {self._health_path()}"
        ready = {e["replica"] for e in self.events() if e.get("event") == "ready"}
        missing = [n for n in self.replica_names() if n not in ready]
        if missing:
            return f"recorder has no ready event for {', '.join(missing)}"
        return None

    @classmethod
    def attach(cls, state_dir: Path) -> Lab:
        """Handle on the lab described by ``state_dir/lab.json``.

        Raises:
            LabError: no lab.json there (or unreadable).
        """
        state_dir = Path(state_dir).resolve()
        path = state_dir / LAB_FILE
        try:
            meta = json.loads(path.read_text())
        except FileNotFoundError:
            raise LabError(f"no lab in {state_dir} (no {LAB_FILE}); run lab up first") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise LabError(f"cannot read {path}: {exc}") from exc
        return cls(state_dir, meta)

    # -- simple accessors ------------------------------------------------------------------
    @property
    def url(self) -> str:
        """HAProxy frontend URL, e.g. ``http://127.0.0.1:8800``."""
        return str(self.meta["url"])

    def replica_names(self) -> list[str]:
        """``["r0", "r1", ...]``."""
        return [r["name"] for r in self.meta["replicas"] if not r.get("standby")]

    def engine_name(self) -> str:
        """Engine the replicas run (``"sim"`` | ``"llama-cpp"``)."""
        return str(self.meta["engine"])

    def events(self) -> list[dict[str, Any]]:
        """Ground-truth records from ``events.jsonl`` in file order."""
        return read_events(self.state_dir / EVENTS_FILE)

    def _health_path(self) -> str:
        return str(self.meta.get("health_path") or "/health")

    def _replica(self, name: str) -> dict[str, Any]:
        for rep in self.meta["replicas"]:
            if rep["name"] == name:
                return dict(rep)
        raise LabError(f"unknown replica {name!r}; the lab has {', '.join(self.replica_names())}")

    def _cgroup(self, name: str) -> MemoryCgroup:
        return MemoryCgroup(Path(self._replica(name)["cgroup"]), int(self.meta["cgroup_version"]))

    def _supervisord_pid(self) -> int | None:
        pid = self.meta.get("pids", {}).get("supervisord")
        return int(pid) if pid else None

    def _supervisord_alive(self) -> bool:
        pid = self._supervisord_pid()
        # pid_max can be 32768 in containers: a stale pid may now belong to another lab's
        # supervisord, so check it runs *this* lab's config before signalling it
        cmdline = procfs.cmdline(pid or 0)
        return (
            bool(pid)
            and _alive(pid)
            and "supervisord" in cmdline
            and str(self.state_dir) in cmdline
        )

    def _process_infos(self) -> dict[str, dict[str, Any]]:
        try:
            return {p["name"]: p for p in _rpc(self.state_dir, 2.0).supervisor.getAllProcessInfo()}
        except (OSError, xmlrpc.client.Error, http.client.HTTPException):
            return {}

    def _pids(self) -> dict[str, Any]:
        infos = self._process_infos()
        pids: dict[str, Any] = {"supervisord": self._supervisord_pid()}
        for name in ("haproxy", "recorder", "gateway"):
            pids[name] = infos.get(name, {}).get("pid") or None
        pids["replicas"] = {n: infos.get(n, {}).get("pid") or None for n in self.replica_names()}
        return pids

    def admin_token(self) -> str | None:
        """The lab's admin token for the sim engines' fault control plane, or None.

        Sent as ``X-Chaos-Admin-Token`` to a replica's ``/admin/faults`` (see
        :mod:`chaoslib_infer.lab.engine`, "Fault modes"). None when the lab has no token file (a lab
        started by an older version; its engines then answer loopback peers only). Never log it.
        """
        try:
            lines = (self.state_dir / ADMIN_TOKEN_FILE).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            return None
        return (lines[0].strip() or None) if lines else None

    def replica_host(self, name: str) -> str:
        """Address replica ``name`` listens on: its node's IP, or 127.0.0.1 without nodes."""
        if not self.meta.get("nodes"):
            return "127.0.0.1"
        from chaoslib_infer.lab.netns import replica_host

        return replica_host(self.state_dir, name)

    def lose_node(
        self, node: str = "auto", down_s: float = 60.0, reschedule_after_s: float = 3.0
    ) -> dict[str, Any]:
        """Lose a whole node (network cut, replicas killed; rescheduled onto a spare node after
        ``reschedule_after_s``, node back after ``down_s``): see :mod:`chaoslib_infer.lab.nodes`.

        Raises:
            LabError: see :func:`chaoslib_infer.lab.nodes.lose_node`.
        """
        from chaoslib_infer.lab import nodes as lab_nodes

        return lab_nodes.lose_node(self, node, down_s, reschedule_after_s)

    def replica_pid(self, name: str) -> int | None:
        """Current pid of a replica's engine (None when not running)."""
        self._replica(name)
        info = self._process_infos().get(name)
        return int(info["pid"]) if info and info.get("pid") else None

    # -- status ----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """JSON-able snapshot: url, engine, running, replicas[...], haproxy, active_faults.

        Each replica carries ``engine_faults``: the fault modes its sim engine has armed, asked
        of the engine itself (:func:`chaoslib_infer.lab.engine_admin.armed`; ``[]`` when none or
        not running, ``None`` for another engine or a stopped lab), and ``engine_faults_error``
        when the engine could not be asked. ``active_faults`` is the lab's fault ledger (every
        kind), each record checked by its module.
        """
        running = self._supervisord_alive()
        engine_faults: dict[str, Any] = {}
        if running and self.engine_name() == "sim":
            from chaoslib_infer.lab.engine_admin import lab_engine_faults

            engine_faults = lab_engine_faults(self)
        infos = self._process_infos() if running else {}
        try:
            stats = hap.show_stat(self.state_dir / HAPROXY_SOCK) if running else {}
        except OSError:
            stats = {}
        starts: dict[str, int] = {}
        for ev in self.events():
            if ev.get("event") == "start":
                starts[ev["replica"]] = starts.get(ev["replica"], 0) + 1
        reps = []
        for rep in self.meta["replicas"]:
            name = rep["name"]
            info = infos.get(name, {})
            cg = self._cgroup(name)
            srv = stats.get(name, {})
            reps.append(
                {
                    "name": name,
                    "port": rep["port"],
                    "pid": info.get("pid") or None,
                    "state": info.get("statename", "DOWN" if not running else "UNKNOWN"),
                    "healthy": running
                    and _http_status(
                        int(rep["port"]), self._health_path(), 0.5, self.replica_host(name)
                    )
                    == 200,
                    "host": self.replica_host(name),
                    "haproxy_status": srv.get("status") or None,
                    "cgroup": rep["cgroup"],
                    "memory_bytes": cg.usage_bytes(),
                    "memory_limit_bytes": cg.limit_bytes(),
                    "oom_kills": cg.oom_kills(),
                    "restarts": max(0, starts.get(name, 0) - 1),
                    "standby": bool(rep.get("standby")),
                    **_engine_fault_fields(engine_faults.get(name)),
                }
            )
        hinfo = infos.get("haproxy", {})
        node_info: dict[str, Any] = {}
        if self.meta.get("nodes"):
            from chaoslib_infer.lab import nodes as lab_nodes

            node_info["nodes"] = lab_nodes.node_status(self)
        return {
            "url": self.url,
            "engine": self.engine_name(),
            "lab_id": self.meta["lab_id"],
            "state_dir": str(self.state_dir),
            "running": running,
            "supervisord_pid": self._supervisord_pid() if running else None,
            "haproxy": {"pid": hinfo.get("pid") or None, "state": hinfo.get("statename", "DOWN")},
            "gateway": self.meta.get("gateway", "haproxy"),
            "cgroup_version": self.meta["cgroup_version"],
            "replicas": reps,
            **node_info,
            "active_faults": self._active_faults(),
        }

    # -- faults ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _faults(self) -> Iterator[list[dict[str, Any]]]:
        """Locked read-modify-write of faults.json."""
        lock_path = self.state_dir / (FAULTS_FILE + ".lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.state_dir / FAULTS_FILE
            try:
                faults: list[dict[str, Any]] = json.loads(path.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                faults = []
            yield faults
            _write_json(path, faults)

    def _active_faults(self) -> list[dict[str, Any]]:
        try:
            faults = json.loads((self.state_dir / FAULTS_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return []
        from chaoslib_infer.safety import registry

        active = []
        for f in faults:
            try:
                if registry.fault_active(self, f):
                    active.append(f)
            except registry.LedgerRefused as exc:  # nothing of it ran; never hide it either
                active.append({**f, "refused": str(exc)} if isinstance(f, dict) else f)
            except Exception:  # an unknown state is reported as active: never hide a fault
                active.append(f)
        return active

    def add_fault(self, record: dict[str, Any]) -> str:
        """Record an active fault in ``faults.json`` *before* it is injected (the rollback ledger).

        Args:
            record: JSON-able mapping with at least ``kind`` and ``module``: the module that injected
                it, which must define ``undo_fault(lab, record) -> str | None`` (idempotent; returns a
                description of what it undid) and ``fault_active(lab, record) -> bool``. Put in it
                everything the undo needs (pids, paths, previous values). ``injected_at`` is added,
                and ``ttl_s`` (:data:`DEFAULT_FAULT_TTL_S` when absent): the lab's dead-man
                watchdog undoes the fault once ``injected_at + ttl_s`` has passed, even if the
                runner that injected it was killed (``chaoslib_infer.safety.deadman``).

        Returns:
            The fault id (also stored as ``record["id"]``).
        """
        if "kind" not in record or "module" not in record:
            raise LabError("a fault record needs 'kind' and 'module'")
        ttl = record.get("ttl_s")
        if ttl is not None:
            try:
                seconds = float("nan") if isinstance(ttl, bool) else float(ttl)
            except (TypeError, ValueError):
                seconds = float("nan")
            if not 0 < seconds < float("inf"):
                raise LabError(f"a fault record's ttl_s must be a positive number, got {ttl!r}")
            ttl = seconds
        fault_id = f"{record['kind']}-{os.urandom(4).hex()}"
        entry = {
            **record,
            "id": fault_id,
            "injected_at": record.get("injected_at", time.time()),
            "ttl_s": float(ttl if ttl is not None else DEFAULT_FAULT_TTL_S),
        }
        with self._faults() as faults:
            faults.append(entry)
        described = {k: record[k] for k in _EVENT_FIELDS if k in record}
        self._fault_event(
            record.get("replica"), "injected", kind=record["kind"], fault_id=fault_id, **described
        )
        return fault_id

    def remove_fault(self, fault_id: str, undo: bool = True) -> str | None:
        """Undo (unless ``undo`` is False) and forget one recorded fault. Unknown id: ``None``."""
        with self._faults() as faults:
            found = [f for f in faults if f.get("id") == fault_id]
        if not found:
            return None
        f = found[0]
        note = None
        if undo and f.get("module"):
            from chaoslib_infer.safety import registry

            # undo first: if it raises, the record stays in the ledger for `chaos-infer rollback`;
            # only the record rebuilt from validated fields reaches the module (LedgerRefused)
            note = registry.undo(self, f)
        with self._faults() as faults:
            faults[:] = [x for x in faults if x.get("id") != fault_id]
        self._fault_event(f.get("replica"), "cleared", kind=f.get("kind"), fault_id=fault_id)
        return note

    def _fault_event(
        self, replica: str | None, phase: str, kind: str | None = "oom-kill", **extra: Any
    ) -> None:
        """Append a ``{"event": "fault", "kind", "replica", "phase", ...}`` ground-truth event."""
        append_event(
            self.state_dir / EVENTS_FILE,
            {
                "t": time.time(),
                "event": "fault",
                "kind": kind,
                "replica": replica,
                "phase": phase,
                **extra,
            },
        )

    def oom_kill(self, replica: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Make the kernel OOM-kill ``replica``'s engine with a memory hog in its cgroup.

        Returns:
            ``{"replica", "fault_at", "oom_kills_before", "oom_kills_after", "killed_pid",
            "hog_pid", "cgroup", "injected_at"}``; ``fault_at`` is the unix time the OOM kill
            was observed (the cgroup's counter rose), ``injected_at`` when the hog started.

        Raises:
            LabError: unknown or not running replica, a fault already active on it, or no OOM
                kill within ``timeout_s`` (the hog is removed).
        """
        cg = self._cgroup(replica)
        if not self._supervisord_alive():
            raise LabError(f"the lab in {self.state_dir} is not running")
        if any(f.get("replica") == replica for f in self._active_faults()):
            raise LabError(f"an oom-kill fault is already active on {replica}")
        info = self._process_infos().get(replica, {})
        killed_pid = int(info.get("pid") or 0)
        if info.get("statename") != "RUNNING" or not killed_pid:
            raise LabError(f"replica {replica} is not running ({info.get('statename', 'unknown')})")
        before = cg.oom_kills()
        (self.state_dir / "logs").mkdir(exist_ok=True)
        env = child_env()  # lab children never get the API key
        env["PYTHONPATH"] = os.pathsep.join(
            [_PACKAGE_PARENT, *filter(None, [env.get("PYTHONPATH")])]
        )
        with open(self.state_dir / "logs" / "hog.log", "ab") as err:
            hog = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    HOG_MODULE,
                    "--cgroup",
                    str(cg.path),
                    "--version",
                    str(cg.version),
                    "--ttl-s",
                    f"{max(timeout_s + 5.0, 10.0):g}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        injected_at = time.time()
        with self._faults() as faults:
            faults.append(
                {
                    "kind": "oom-kill",
                    "replica": replica,
                    "pid": hog.pid,
                    "hog_pid": hog.pid,
                    "cgroup": str(cg.path),
                    "target_pid": killed_pid,
                    "injected_at": injected_at,
                }
            )
        self._fault_event(replica, "injected", hog_pid=hog.pid, target_pid=killed_pid)
        try:
            assert hog.stdout is not None
            ready, _, _ = select.select([hog.stdout], [], [], 10.0)
            line = hog.stdout.readline().decode().strip() if ready else ""
            if not line.startswith("armed"):
                raise LabError(
                    f"memory hog failed to start in {cg.path}: {_tail(self.state_dir / 'logs' / 'hog.log') or 'no output'}"
                )
            deadline = time.monotonic() + timeout_s
            after = cg.oom_kills()
            while after <= before:
                if hog.poll() is not None:
                    raise LabError(
                        f"memory hog exited ({hog.returncode}) before any OOM kill in {replica}"
                    )
                if time.monotonic() > deadline:
                    raise LabError(
                        f"no OOM kill in {replica}'s cgroup within {timeout_s:g} s "
                        f"(usage {cg.usage_bytes() >> 20} MiB of {(cg.limit_bytes() or 0) >> 20} MiB); hog removed"
                    )
                time.sleep(0.001)
                after = cg.oom_kills()
            fault_at = time.time()
            # The hog's job is done: free its memory *now* rather than when it gets scheduled
            # (it exits by itself too), so the restarted engine never meets a full cgroup.
            hog.kill()
            hog.wait(timeout=5.0)
            if not _wait_dead(killed_pid, 3.0):
                raise LabError(
                    f"the kernel OOM kill in {replica}'s cgroup did not kill its engine pid {killed_pid}"
                )
        finally:
            if hog.poll() is None:
                hog.kill()
                hog.wait()
            if hog.stdout is not None:
                hog.stdout.close()
            with self._faults() as faults:
                faults[:] = [f for f in faults if f.get("pid") != hog.pid]
            self._fault_event(replica, "cleared", hog_pid=hog.pid, hog_exit=hog.returncode)
        return {
            "replica": replica,
            "fault_at": fault_at,
            "oom_kills_before": before,
            "oom_kills_after": after,
            "killed_pid": killed_pid,
            "hog_pid": hog.pid,
            "cgroup": str(cg.path),
            "injected_at": injected_at,
        }

    def clear_faults(self) -> list[str]:
        """Undo every recorded fault (each through its module's ``undo_fault``) and kill leftover
        memory hogs (faults.json and any hog found in replica cgroups). Returns what was undone."""
        from chaoslib_infer.safety import registry

        undone: list[str] = []
        with self._faults() as faults:
            known = list(faults)
            faults.clear()
        seen: set[int] = set()
        for f in known:
            try:  # a record that is not a fault of this lab runs nothing and stays
                clean = registry.validate(self, f)
            except registry.LedgerRefused as exc:
                undone.append(f"undo REFUSED: {exc}")
                with self._faults() as faults:
                    faults.append(f)
                continue
            if f.get("module"):
                try:
                    note = registry.undo(self, f)
                except Exception as exc:  # keep undoing the others; report this one
                    note = f"{f.get('kind')} {f.get('id')}: undo FAILED: {exc}"
                    with self._faults() as faults:
                        faults.append(f)
                undone.append(note or f"{f.get('kind')} {f.get('id')}: nothing left to undo")
                self._fault_event(
                    f.get("replica"), "cleared", kind=f.get("kind"), fault_id=f.get("id")
                )
                continue
            pid = int(clean.get("pid") or 0)  # 0: the hog is gone (or its pid was reused)
            seen.add(int(f.get("pid") or 0))
            if _is_hog(pid):
                _kill(pid)
                undone.append(f"oom-kill on {f.get('replica')}: killed memory hog pid {pid}")
            # the event names the fault it clears (the recorded hog), whether or not its process
            # was still there to kill: the ground truth pairs it with its 'injected' event
            self._fault_event(
                str(f.get("replica")), "cleared", hog_pid=int(f.get("pid") or 0) or pid
            )
        for rep in self.meta["replicas"]:
            for pid in self._cgroup(rep["name"]).pids():
                if pid not in seen and _is_hog(pid):
                    _kill(pid)
                    undone.append(f"oom-kill on {rep['name']}: killed stray memory hog pid {pid}")
                    self._fault_event(rep["name"], "cleared", hog_pid=pid)
        return undone

    # -- ground truth ----------------------------------------------------------------------
    def served(self, replica: str, after: float) -> float | None:
        """Unix time of the first request ``replica`` served after ``after`` (None if none yet).

        Combines the engine ledger (generation start) and HAProxy's request log (time the request
        reached the server, 2xx/3xx answers only); the earliest wins.
        """
        self._replica(replica)
        best: float | None = None
        try:
            with open(self.state_dir / LEDGER_FILE) as fh:
                for line in fh:
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if (
                        entry.get("replica") != replica
                        or entry.get("event", "generation") != "generation"
                    ):
                        continue
                    t = float(entry.get("t", 0.0))
                    if t > after and (best is None or t < best):
                        best = t
        except FileNotFoundError:
            pass
        for rec in hap.parse_request_log(self.state_dir / REQUEST_LOG):
            if rec.server != replica or not 200 <= rec.status < 400:
                continue
            t2 = rec.forwarded_t
            if t2 is not None and t2 > after and (best is None or t2 < best):
                best = t2
        return best

    # -- teardown --------------------------------------------------------------------------
    def down(self) -> None:
        """Stop supervisord and everything it runs, kill strays in the lab cgroups, remove them.

        Idempotent; safe on a half-started lab.
        """
        with contextlib.suppress(Exception):
            self.clear_faults()
        pid = self._supervisord_pid()
        if self._supervisord_alive():
            with contextlib.suppress(OSError, xmlrpc.client.Error, http.client.HTTPException):
                _rpc(self.state_dir, 5.0).supervisor.shutdown()
            assert pid is not None
            if not _wait_dead(pid, 15.0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                if not _wait_dead(pid, 5.0):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    _wait_dead(pid, 5.0)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1.0)
        root = Path(self.meta["cgroup_root"])
        version = int(self.meta["cgroup_version"])
        errors: list[str] = []
        try:
            kill_tree(root, version)
        except CgroupError as exc:
            errors.append(str(exc))
        # Belt and braces: recorded pids that still run this lab's programs.
        recorded = self.meta.get("pids", {})
        cands = [
            recorded.get("haproxy"),
            recorded.get("recorder"),
            recorded.get("gateway"),
            *recorded.get("replicas", {}).values(),
        ]
        for cand in cands:
            if cand and _alive(int(cand)) and str(self.state_dir) in procfs.cmdline(int(cand)):
                _kill(int(cand))
        if self.meta.get("nodes"):  # namespaces, veths, guard route (processes are gone)
            from chaoslib_infer.lab import nodes as lab_nodes

            errors += lab_nodes.teardown_nodes(self.meta)
        try:
            remove_tree(root)
        except CgroupError as exc:
            errors.append(str(exc))
        for sock in (SUPERVISOR_SOCK, HAPROXY_SOCK):
            with contextlib.suppress(OSError):
                (self.state_dir / sock).unlink()
        if self.meta.get("down_at") is None and (self.state_dir / LAB_FILE).exists():
            self.meta["down_at"] = time.time()
            _write_json(self.state_dir / LAB_FILE, self.meta)
        if errors:
            raise LabError("lab teardown incomplete: " + "; ".join(errors))


def _engine_fault_fields(answer: Any) -> dict[str, Any]:
    """A replica's ``engine_faults`` (and ``engine_faults_error``) fields of :meth:`Lab.status`."""
    if isinstance(answer, list):
        return {"engine_faults": answer}
    if isinstance(answer, dict):
        return {"engine_faults": None, "engine_faults_error": str(answer.get("error"))}
    return {"engine_faults": None}


def _fault_module(name: str) -> Any:
    """Import the module that owns a fault kind (``undo_fault`` / ``fault_active``): only a
    module of the registry (:data:`chaoslib_infer.safety.registry.FAULT_MODULES`).

    Raises:
        LedgerRefused: any other name (never imported).
    """
    from chaoslib_infer.safety import registry

    return registry.fault_module(name)


def _is_hog(pid: int) -> bool:
    return bool(pid) and _alive(pid) and HOG_MODULE in procfs.cmdline(pid)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait_dead(pid, 5.0)
