"""The lab's lifecycle: bring a lab up, wait until it is ready, take it down.

``Lab.up`` is :func:`up` (arguments checked, state directory prepared, ``lab.json`` planned, then
:func:`start` and :func:`wait_ready`; anything started is torn down on failure), ``Lab.attach``
reads :func:`read_meta`, ``Lab.wait_healthy`` is :func:`wait_healthy` and ``Lab.down`` is
:func:`down`. The configuration files are rendered by :mod:`chaoslib_infer.lab.render`; nodes are
set up and torn down by :mod:`chaoslib_infer.lab.topology`; standby replicas and the autoscaler
are configured by :mod:`chaoslib_infer.lab.standby`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import xmlrpc.client
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaoslib_infer.errors import InferChaosError
from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab import procfs, prometheus_server, render, topology
from chaoslib_infer.lab.cgroups import (
    CgroupError,
    MemoryCgroup,
    detect_hierarchy,
    kill_tree,
    remove_tree,
)
from chaoslib_infer.lab.engines import check_sim_args, engine_command, health_path
from chaoslib_infer.lab.gateways import dispatch as lab_gateways
from chaoslib_infer.lab.ports import free_port, http_status, port_free
from chaoslib_infer.lab.processes import alive, kill, lab_child_env, spawn_in_cgroup, wait_dead
from chaoslib_infer.lab.recorder import EVENTS_FILE, SUPERVISORD_LOG
from chaoslib_infer.lab.standby import QUEUE_SAMPLES, scaling_options, supervisor_program
from chaoslib_infer.lab.statedir import (
    ADMIN_TOKEN_FILE,
    ENGINE_FAULTS_DIR,
    FAULTS_FILE,
    GATEWAY_FILES,
    HAPROXY_SOCK,
    LAB_FILE,
    LEDGER_FILE,
    MAX_REPLICAS,
    MIN_MEMORY_MB,
    REQUEST_LOG,
    SUPERVISOR_SOCK,
    LabError,
    tail,
    write_json,
    write_secret,
)
from chaoslib_infer.lab.supervisor_rpc import rpc

if TYPE_CHECKING:
    from chaoslib_infer.lab.fleet import Lab

__all__ = [
    "down",
    "lab_pids",
    "not_ready_reason",
    "read_meta",
    "start",
    "up",
    "wait_healthy",
    "wait_ready",
]


def up(
    lab_class: type[Lab],
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
    """Start a lab (an instance of ``lab_class``; ``Lab.up`` is this function as a classmethod)
    and wait until every replica is ready and HAProxy answers.

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

    ``gateway`` is the process on the lab's URL: ``haproxy`` (the above; with ``gateway_config``
    the user's haproxy.cfg, a Jinja2 template over the lab's replicas, into which the lab
    injects its runtime socket and request log: :mod:`chaoslib_infer.lab.gateways.haproxy_user`;
    ``gateway_retry`` is then refused) or ``nginx`` with
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
        raise LabError(f"memory_limit_mb must be at least {MIN_MEMORY_MB}, got {memory_limit_mb}")
    if ready_timeout_s <= 0:
        raise LabError(f"ready_timeout_s must be positive, got {ready_timeout_s}")
    scaling_meta = scaling_options(
        replicas,
        standby,
        autoscale,
        scale_out_queue,
        scale_out_after_s,
        scale_out_cooldown_s,
        MAX_REPLICAS,
    )
    state_dir = Path(state_dir).resolve()
    ledger = state_dir / LEDGER_FILE
    sample_argv = engine_command(engine, "r0", 1, ledger, engine_args)  # validates the name
    if engine == "sim":
        check_sim_args(engine_args or {}, sample_argv)
    n_nodes, spare = topology.validate_nodes(nodes, spare_node, sample_argv)
    haproxy_bin = hap.find_haproxy()
    if haproxy_bin is None:
        raise LabError("haproxy not found: apt-get install haproxy")
    if gateway == "haproxy" and gateway_config is not None and gateway_retry:
        raise LabError(
            "gateway_retry is the lab's own HAProxy setting; with gateway_config your "
            "haproxy.cfg decides the retries (retry-on, retries, option redispatch)"
        )
    try:
        lab_gateways.precheck(gateway, gateway_config, [f"r{i}" for i in range(replicas)])
    except lab_gateways.GatewayError as exc:
        raise LabError(str(exc)) from None
    state_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # the admin token and the fault ledger live here
        os.chmod(state_dir, 0o700)
    if (state_dir / LAB_FILE).exists():
        old = lab_class(state_dir, json.loads((state_dir / LAB_FILE).read_text()))
        if old.supervisord_alive():
            raise LabError(f"a lab is already running in {state_dir}; run down first")
        old.down()
    try:
        hierarchy = detect_hierarchy()
    except CgroupError as exc:
        raise LabError(str(exc)) from exc

    if port == 0:
        port = free_port()
    elif not port_free(port):
        raise LabError(f"port {port} on 127.0.0.1 is already in use")
    ports: list[int] = []
    n_lanes = replicas + standby if gateway == "litellm" else 0  # one lane per replica
    while len(ports) < replicas + standby + (gateway != "haproxy") + n_lanes:
        p = free_port()
        if p != port and p not in ports:
            ports.append(p)
    lane_ports = [ports.pop() for _ in range(n_lanes)]
    metrics_port = free_port()  # HAProxy's Prometheus exporter (lab.prometheus_server)
    while metrics_port == port or metrics_port in ports or metrics_port in lane_ports:
        metrics_port = free_port()

    for name in (
        EVENTS_FILE,
        LEDGER_FILE,
        REQUEST_LOG,
        SUPERVISORD_LOG,
        FAULTS_FILE,
        "supervisord.out",
        QUEUE_SAMPLES,
        "placement.json",
        ADMIN_TOKEN_FILE,
        *GATEWAY_FILES,
    ):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()
    write_secret(state_dir / ADMIN_TOKEN_FILE, secrets.token_hex(32))
    (state_dir / "logs").mkdir(exist_ok=True)
    for log in (*(state_dir / "logs").glob("*"), *(state_dir / ENGINE_FAULTS_DIR).glob("*")):
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
        "haproxy_metrics_port": metrics_port,
        **({"lanes": dict(zip(names, lane_ports, strict=True))} if n_lanes else {}),
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
    lab = lab_class(state_dir, meta)
    try:
        if n_nodes:
            topology.plan_nodes(meta, n_nodes, spare)
        start(lab, haproxy_bin)
        wait_ready(lab, ready_timeout_s)
        if lab_gateways.figured(meta):  # the first-token gap without the gateway (figures)
            first = meta["replicas"][0]
            from chaoslib_infer.lab.gateways.figures import calibrate

            calibrate(state_dir, lab.replica_host(first["name"]), first["port"])
    except BaseException as exc:
        with contextlib.suppress(Exception):
            lab.down()
        if isinstance(exc, LabError):
            raise
        if isinstance(exc, CgroupError | OSError):
            raise LabError(f"lab failed to start: {exc}") from exc
        raise
    return lab


def _haproxy_cfg(meta: dict[str, Any], sd: Path, health_path: str) -> str:
    """haproxy.cfg: the user's template (``gateway: haproxy`` with ``gateway_config``,
    :mod:`chaoslib_infer.lab.gateways.haproxy_user`) or the lab's own (:func:`render.haproxy_cfg`).

    Raises:
        LabError: the user's config does not render or the lab refuses it (one line).
    """
    path = (meta.get("gateway_info") or {}).get("config_path")
    if lab_gateways.gateway_of(meta) != "haproxy" or not path:
        return render.haproxy_cfg(meta, sd, health_path)
    from chaoslib_infer.lab.gateways import haproxy_user

    try:
        return haproxy_user.lab_config(meta, sd, health_path, Path(path).read_text(), path)
    except (haproxy_user.HAProxyConfigError, OSError) as exc:
        raise LabError(str(exc)) from None


def start(lab: Lab, haproxy_bin: str) -> None:
    """Create the cgroups, write haproxy.cfg and supervisord.conf, start supervisord (in the
    lab's ``ctl`` cgroup, its own session; kept as ``lab.supervisord_process``).

    Raises:
        LabError: HAProxy rejected its configuration; CgroupError, OSError: see ``Lab.up``.
    """
    meta, sd = lab.meta, lab.state_dir
    version = int(meta["cgroup_version"])
    MemoryCgroup(Path(meta["cgroup_root"]), version).create()
    MemoryCgroup(Path(meta["ctl_cgroup"]), version).create()
    for rep in meta["replicas"]:
        MemoryCgroup(Path(rep["cgroup"]), version).create(int(meta["memory_limit_bytes"]))
    write_json(sd / LAB_FILE, meta)

    cfg = sd / "haproxy.cfg"
    cfg.write_text(_haproxy_cfg(meta, sd, lab.health_path()))
    on_nodes = bool(meta.get("nodes"))
    if on_nodes:  # namespaces first; replicas on nodes listen on the node address
        topology.setup_nodes(lab)
        hosts = {r["name"]: (r["host"], int(r["port"])) for r in meta["replicas"]}
        cfg.write_text(topology.haproxy_config(cfg.read_text(), hosts))
    if meta.get("lanes"):  # LiteLLM's deployments reach the replicas through lanes
        from chaoslib_infer.lab.gateways.litellm import lanes_config

        lane_servers = {
            r["name"]: (lab.replica_host(r["name"]), int(r["port"]), bool(r.get("standby")))
            for r in meta["replicas"]
        }
        cfg.write_text(cfg.read_text() + "\n" + lanes_config(meta["lanes"], lane_servers))
    check = subprocess.run(
        [haproxy_bin, "-c", "-q", "-f", str(cfg)],
        capture_output=True,
        text=True,
        timeout=10,
        env=lab_child_env(),
    )
    if check.returncode != 0:
        first = (check.stderr or check.stdout).strip().splitlines()[:1]
        raise LabError(f"haproxy rejected {cfg}: {first[0] if first else check.returncode}")

    programs = []
    request_log = sd / REQUEST_LOG
    if meta.get("gateway", "haproxy") != "haproxy":  # nginx on the lab's URL, HAProxy beside
        # here, not at module level: nginx imports jinja2, which the lab's helper processes
        # (watchdog, node controller, autoscaler) import this module without needing
        from chaoslib_infer.lab.gateways import nginx as lab_nginx

        servers = [
            {"name": r["name"], "addr": f"{lab.replica_host(r['name'])}:{r['port']}"}
            for r in meta["replicas"]
            if not r.get("standby")
        ]
        try:
            programs.append(lab_gateways.start_programs(sd, servers, sys.executable))
        except InferChaosError as exc:
            raise LabError(str(exc)) from None
        path = meta["gateway_info"].get("config_path")
        lab_gateways.record(sd, meta["gateway"], path, Path(path).read_text() if path else None)
        if meta["gateway"] == "nginx":
            request_log = sd / "haproxy-wire.log"  # HAProxy off the client path: health checks
            (sd / lab_nginx.ACCESS_LOG).touch()
            (sd / REQUEST_LOG).symlink_to(lab_nginx.ACCESS_LOG)
        # litellm: HAProxy's own log is the request log (one line per upstream try, its lanes)
    elif lab_gateways.figured(meta):  # HAProxy with the user's config: its evidence block
        path = meta["gateway_info"]["config_path"]
        lab_gateways.record(sd, "haproxy", path, Path(path).read_text())
    engine_args = dict(meta["engine_args"])
    if meta["engine"] == "sim":  # the fault control plane answers the lab's token only
        engine_args["admin_token_file"] = str(sd / ADMIN_TOKEN_FILE)
        engine_args["fault_state_dir"] = str(sd / ENGINE_FAULTS_DIR)  # crashes survive restarts
        if lab_gateways.figured(meta):  # stream buffering (gateways)
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
        if on_nodes:  # cgroup, then the node's namespace, then the engine
            wrapped = topology.program_command(sd, rep, cmd)
        programs.append(render.replica_program(rep, wrapped, sd / "logs"))
    programs.append(
        supervisor_program(
            meta,
            sd,
            [sys.executable, "-m", "chaoslib_infer.lab.scaling", "--state-dir", str(sd)],
        )
    )
    conf = sd / "supervisord.conf"
    conf.write_text(
        render.supervisord_conf(
            meta, sd, [haproxy_bin, "-db", "-f", str(cfg)], request_log, programs
        )
    )
    lab.supervisord_process = spawn_in_cgroup(
        meta["ctl_cgroup"],
        [sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)],
        sd,
        sd / "supervisord.out",
    )
    meta["pids"] = {"supervisord": lab.supervisord_process.pid}
    write_json(sd / LAB_FILE, meta)


#: the gateway's own liveness path, where it is not the engines' (LiteLLM's ``/health`` calls
#: every deployment; ``/health/liveliness`` answers for the proxy itself)
FRONT_HEALTH = {"litellm": "/health/liveliness"}


def wait_ready(lab: Lab, timeout_s: float) -> None:
    """Block until :func:`not_ready_reason` says ready; record ``ready_at`` and the pids.

    Raises:
        LabError: supervisord exited, a program failed for good, or not ready in time.
    """
    deadline = time.monotonic() + timeout_s
    sd = lab.state_dir
    problem: str | None = "supervisord not answering"
    while time.monotonic() < deadline:
        if not lab.supervisord_alive():
            if lab.supervisord_process is not None and lab.supervisord_process.poll() is None:
                # still running: cgexec is exec'ing supervisord (cmdline briefly empty)
                time.sleep(0.02)
                continue
            detail = tail(sd / "supervisord.out") or tail(sd / SUPERVISORD_LOG)
            raise LabError(f"supervisord exited during start: {detail or 'no output'}")
        problem = not_ready_reason(lab)
        if problem is None:
            lab.meta["ready_at"] = time.time()
            lab.meta["pids"] = lab_pids(lab)
            write_json(sd / LAB_FILE, lab.meta)
            return
        if problem.startswith("FATAL:"):
            raise LabError(problem[6:])
        time.sleep(0.02)
    raise LabError(f"lab not ready within {timeout_s:g} s: {problem}")


def wait_healthy(lab: Lab, timeout_s: float = 30.0) -> None:
    """Block until every replica is ready and HAProxy sees it UP (between drills).

    Raises:
        LabError: not healthy within ``timeout_s`` seconds (message says what is not ready).
    """
    deadline = time.monotonic() + timeout_s
    problem: str | None = "unknown"
    while time.monotonic() < deadline:
        problem = not_ready_reason(lab)
        if problem is None:
            return
        time.sleep(0.05)
    raise LabError(
        f"lab not healthy within {timeout_s:g} s: {(problem or '').removeprefix('FATAL:')}"
    )


def not_ready_reason(lab: Lab) -> str | None:
    """None when ready, else why not (``FATAL:`` prefix = give up now)."""
    sd = lab.state_dir
    try:
        infos = {p["name"]: p for p in rpc(sd, 1.0).supervisor.getAllProcessInfo()}
    except (OSError, xmlrpc.client.Error, http.client.HTTPException):
        return "supervisord not answering"
    gateway = ["gateway"] if lab.meta.get("gateway", "haproxy") != "haproxy" else []
    for name in [*lab.replica_names(), "haproxy", *gateway]:
        info = infos.get(name)
        if info is None:
            return f"{name} unknown to supervisord"
        if info["statename"] in ("FATAL", "BACKOFF") or (
            name in ("haproxy", "gateway") and info["statename"] == "EXITED"
        ):
            log = sd / "logs" / ("haproxy.err" if name == "haproxy" else f"{name}.log")
            if name == "gateway" and lab.meta.get("gateway") == "nginx":
                log = sd / "logs" / "nginx.err"
            return f"FATAL:{name} failed to start ({info['statename']}): {tail(log) or info['spawnerr']}"
        if info["statename"] != "RUNNING":
            return f"{name} is {info['statename']}"
    exits: dict[str, list[dict[str, Any]]] = {}
    for ev in lab.events():
        if ev.get("event") == "exit" and not ev.get("expected"):  # not a supervisord stop
            exits.setdefault(ev["replica"], []).append(ev)
    ready_at = lab.meta.get("ready_at")
    for name, evs in exits.items():
        if ready_at:  # after start-up, drills kill replicas on purpose: only a fast loop counts
            evs = [e for e in evs if float(e.get("t", 0)) > time.time() - 15.0]
        if len(evs) >= 3:
            last = tail(sd / "logs" / f"{name}.log")
            return f"FATAL:{name} keeps exiting ({evs[-1]['cause']}): {last or 'no output'}"
    for rep in lab.meta["replicas"]:
        if rep.get("standby"):
            continue
        host = lab.replica_host(rep["name"])
        if http_status(int(rep["port"]), lab.health_path(), host=host) != 200:
            return f"{rep['name']} {lab.health_path()} not 200 (log: {tail(sd / 'logs' / (rep['name'] + '.log')) or 'empty'})"
    try:
        stats = hap.show_stat(sd / HAPROXY_SOCK)
    except OSError:
        return "haproxy stats socket not answering"
    down = [
        n for n in lab.replica_names() if not stats.get(n, {}).get("status", "").startswith("UP")
    ]
    if down:
        return f"haproxy has {', '.join(down)} not UP yet"
    front = FRONT_HEALTH.get(str(lab.meta.get("gateway")), lab.health_path())
    if http_status(int(lab.meta["port"]), front) != 200:
        return f"{lab.meta.get('gateway', 'haproxy')} frontend not answering {front}"
    ready = {e["replica"] for e in lab.events() if e.get("event") == "ready"}
    missing = [n for n in lab.replica_names() if n not in ready]
    if missing:
        return f"recorder has no ready event for {', '.join(missing)}"
    return None


def read_meta(state_dir: Path) -> dict[str, Any]:
    """The lab described by ``state_dir/lab.json`` (``state_dir`` resolved first).

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
    return meta


def down(lab: Lab) -> None:
    """Stop supervisord and everything it runs, kill strays in the lab cgroups, remove them.

    Idempotent; safe on a half-started lab.
    """
    with contextlib.suppress(Exception):
        lab.clear_faults()
    pid = lab.supervisord_pid()
    if lab.supervisord_alive():
        with contextlib.suppress(OSError, xmlrpc.client.Error, http.client.HTTPException):
            rpc(lab.state_dir, 5.0).supervisor.shutdown()
        assert pid is not None
        if not wait_dead(pid, 15.0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not wait_dead(pid, 5.0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                wait_dead(pid, 5.0)
    if lab.supervisord_process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            lab.supervisord_process.wait(timeout=1.0)
    root = Path(lab.meta["cgroup_root"])
    version = int(lab.meta["cgroup_version"])
    errors: list[str] = []
    try:
        kill_tree(root, version)
    except CgroupError as exc:
        errors.append(str(exc))
    # Belt and braces: recorded pids that still run this lab's programs.
    recorded = lab.meta.get("pids", {})
    cands = [
        recorded.get("haproxy"),
        recorded.get("recorder"),
        recorded.get("gateway"),
        *recorded.get("replicas", {}).values(),
    ]
    for cand in cands:
        if cand and alive(int(cand)) and str(lab.state_dir) in procfs.cmdline(int(cand)):
            kill(int(cand))
    if lab.meta.get("nodes"):  # namespaces, veths, guard route (processes are gone)
        errors += topology.teardown_nodes(lab.meta)
    try:
        remove_tree(root)
    except CgroupError as exc:
        errors.append(str(exc))
    prometheus_server.stop_in(lab.state_dir)  # the lab's Prometheus, when one was started
    for sock in (SUPERVISOR_SOCK, HAPROXY_SOCK):
        with contextlib.suppress(OSError):
            (lab.state_dir / sock).unlink()
    if lab.meta.get("down_at") is None and (lab.state_dir / LAB_FILE).exists():
        lab.meta["down_at"] = time.time()
        write_json(lab.state_dir / LAB_FILE, lab.meta)
    if errors:
        raise LabError("lab teardown incomplete: " + "; ".join(errors))


def lab_pids(lab: Lab) -> dict[str, Any]:
    """``{"supervisord", "haproxy", "recorder", "gateway", "replicas": {name: pid}}`` now
    (None where a program does not run); written to ``lab.json`` once the lab is ready."""
    infos = lab.process_infos()
    pids: dict[str, Any] = {"supervisord": lab.supervisord_pid()}
    for name in ("haproxy", "recorder", "gateway"):
        pids[name] = infos.get(name, {}).get("pid") or None
    pids["replicas"] = {n: infos.get(n, {}).get("pid") or None for n in lab.replica_names()}
    return pids
