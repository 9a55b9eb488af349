"""Exec handlers for the fake API (:attr:`fake_k8s.FakeK8s.exec_handler`) and a kubelet stand-in.

- :class:`SimContainer`: a scripted process table that answers the four in-container programs of
  :mod:`chaoslib_infer.platforms.kubernetes.scripts` (both the ``python3`` and the ``sh``
  versions) the way they answer in a container: no root needed, exact argv recorded.
- :class:`LocalContainer`: a real container-like process tree on this machine (its own PID and
  mount namespaces through ``unshare``, its own memory cgroup with a limit): exec runs the real
  programs inside it through ``nsenter``, the kernel does the freezing and the OOM killing, and a
  kubelet thread reports the container's death (``OOMKilled`` when the cgroup's ``oom_kill``
  counter rose) and restarts it, writing the pod status into the fake. Needs root and a memory
  cgroup (lab tests).
- :func:`kubelet_restart`: the status changes of one in-place container restart, on a timer.
- :class:`ServiceProxy`: the Service's data path (kube-proxy): each request goes to the next
  *ready* endpoint of the fake's EndpointSlices, round robin, and its answer carries that pod's
  name in ``X-Replica-Id`` (as a pod's engine stamps it from the downward API, docs/kubernetes.md);
  the engine behind every pod is one simulated engine, so a fault reaches the traffic only by
  taking its pod out of the endpoints (drained, deleted, not ready).
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fake_k8s import ExecCall, ExecReply, FakeK8s, QuietServer

from chaoslib_infer.platforms.kubernetes import scripts as S

__all__ = ["LocalContainer", "ServiceProxy", "SimContainer", "kubelet_restart", "set_container"]

_PROGRAMS = {"probe": S.PROBE, "signal": S.SIGNAL, "hog": S.HOG, "kill": S.KILL_TREE}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def set_container(
    fake: FakeK8s, ns: str, pod: str, container: str, ready: bool | None = None, **fields: Any
) -> None:
    """Update ``containerStatuses[name=container]`` (``fields``) and, with ``ready``, the pod's
    Ready/ContainersReady conditions, as the kubelet's status manager does."""
    with fake.lock:
        p = fake.objects[("", "pods")][(ns, pod)]
        cs = next(c for c in p["status"]["containerStatuses"] if c["name"] == container)
        cs.update(fields)
        if ready is not None:
            cs["ready"] = ready
            for cond in p["status"]["conditions"]:
                if cond["type"] in ("Ready", "ContainersReady"):
                    cond["status"] = "True" if ready else "False"
                    cond["lastTransitionTime"] = _now()
        p["metadata"]["resourceVersion"] = fake._next_rv()


def kubelet_restart(
    fake: FakeK8s,
    ns: str,
    pod: str,
    container: str = "vllm",
    reason: str = "OOMKilled",
    exit_code: int = 137,
    down_s: float = 0.2,
    ready_s: float = 0.3,
) -> dict[str, float]:
    """The container dies now (``state.terminated``), runs again after ``down_s`` (new container
    id, ``restartCount`` + 1, ``lastState.terminated``) and is Ready ``ready_s`` later.

    Returns:
        Ground truth, filled in as it happens: ``{"died_at", "running_at", "ready_at"}`` (unix s).
    """
    truth: dict[str, float] = {}
    with fake.lock:
        p = fake.objects[("", "pods")][(ns, pod)]
        cs = next(c for c in p["status"]["containerStatuses"] if c["name"] == container)
        started = (cs.get("state") or {}).get("running", {}).get("startedAt", _now())
        term = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": started,
            "finishedAt": _now(),
            "containerID": cs.get("containerID"),
        }
        count = int(cs.get("restartCount") or 0)
    set_container(fake, ns, pod, container, ready=False, state={"terminated": term}, started=False)
    truth["died_at"] = time.time()

    def run() -> None:
        set_container(
            fake,
            ns,
            pod,
            container,
            state={"running": {"startedAt": _now()}},
            lastState={"terminated": term},
            restartCount=count + 1,
            containerID=f"containerd://{uuid.uuid4().hex}",
            started=True,
        )
        truth["running_at"] = time.time()
        t = threading.Timer(ready_s, ready)
        t.daemon = True
        t.start()

    def ready() -> None:
        set_container(fake, ns, pod, container, ready=True)
        truth["ready_at"] = time.time()

    t = threading.Timer(down_s, run)
    t.daemon = True
    t.start()
    return truth


def _program(call: ExecCall) -> tuple[str, str, list[str]]:
    """(interpreter, program name, arguments) of a command run by ``run_script``."""
    cmd = call.command
    interp = cmd[0]
    args = cmd[3:] if interp == "python3" else cmd[4:]
    for name, prog in _PROGRAMS.items():
        if cmd[2] == prog.get(interp):
            return interp, name, args
    raise AssertionError(f"unexpected exec: {cmd[:2]}")


class SimContainer:
    """A scripted container (exec handler): processes ``{pid: {"ppid", "start", "state",
    "comm"}}`` as the in-container programs would see and change them.

    The default table is a model server under tini: ``1 tini``, ``7 python3`` (the server,
    child of 1), ``9 python3`` (its worker). ``on_hog(mb)`` is called when a hog starts.
    """

    def __init__(
        self,
        pod: str,
        procs: dict[int, dict[str, Any]] | None = None,
        has_python: bool = True,
        on_hog: Any = None,
    ) -> None:
        self.pod = pod
        self.procs = procs or {
            1: {"ppid": 0, "start": "100", "state": "S", "comm": "tini"},
            7: {"ppid": 1, "start": "150", "state": "S", "comm": "python3"},
            9: {"ppid": 7, "start": "180", "state": "S", "comm": "python3"},
        }
        self.has_python = has_python
        self.on_hog = on_hog
        self.calls: list[tuple[str, str, list[str]]] = []
        self._next = 40

    def _new(self, comm: str, ppid: int = 0) -> int:
        self._next += 1
        self.procs[self._next] = {
            "ppid": ppid,
            "start": str(9000 + self._next),
            "state": "S",
            "comm": comm,
        }
        return self._next

    def _alive(self, pid: str, start: str) -> bool:
        p = self.procs.get(int(pid))
        return p is not None and p["start"] == start

    def __call__(self, call: ExecCall) -> ExecReply:
        if call.command[0] == "python3" and not self.has_python:
            return ExecReply.not_found("python3")
        interp, name, args = _program(call)
        self.calls.append((interp, name, args))
        out: list[str] = []
        if name == "probe":
            me = self._new(interp)
            out.append(f"self {me}")
            for pid in sorted(self.procs):
                p = self.procs[pid]
                out.append(f"proc {pid} {p['ppid']} {p['start']} {p['state']} 1 {p['comm']}")
            del self.procs[me]
        elif name == "signal":
            sig, ttl, pairs = args[0], float(args[1]), [a.split(":") for a in args[2:]]
            if ttl > 0:
                t = self._new(interp)
                out.append(f"timer {t} {self.procs[t]['start']}")
            for pid, start in pairs:
                if not self._alive(pid, start):
                    out.append(f"gone {pid}")
                    continue
                self.procs[int(pid)]["state"] = "T" if sig == "STOP" else "S"
                out.append(f"sent {pid} {'R' if sig == 'STOP' else 'S'}")
        elif name == "hog":
            h = self._new(interp)
            out.append(f"hog {h} {self.procs[h]['start']} others+1000:3 25769803776")
            if self.on_hog:
                self.on_hog(int(args[0]))
        else:  # kill
            pid, start = args
            if not self._alive(pid, start):
                out.append(f"gone {pid}")
            else:
                kids = [k for k, p in self.procs.items() if p["ppid"] == int(pid)]
                for k in [int(pid), *kids]:
                    self.procs.pop(k, None)
                    out.append(f"killed {k}")
        return ExecReply(stdout="".join(line + "\n" for line in out))


class LocalContainer:
    """A real container-like process tree (see the module docstring); also the exec handler.

    Args:
        fake: the fake API whose pod ``pod`` (namespace ``ns``) this container is.
        init: argv of the container's PID 1 (a ``python3`` first word runs this interpreter).
        limit_bytes: the memory cgroup's limit (None: unlimited).
        has_python: False answers like an image without ``python3`` (the sh versions then run).
        down_s, ready_s: kubelet restart delay and readiness delay after a death, seconds.
    """

    def __init__(
        self,
        fake: FakeK8s,
        ns: str,
        pod: str,
        container: str,
        init: list[str],
        limit_bytes: int | None = None,
        has_python: bool = True,
        down_s: float = 0.2,
        ready_s: float = 0.3,
    ) -> None:
        from chaoslib_infer.lab.cgroups import MemoryCgroup, detect_hierarchy

        self.fake, self.ns, self.pod, self.container = fake, ns, pod, container
        self.init = [sys.executable if init[0] == "python3" else init[0], *init[1:]]
        self.has_python = has_python
        self.down_s, self.ready_s = down_s, ready_s
        hier = detect_hierarchy()
        self.cg = MemoryCgroup(hier.base / f"chaos-k8s-test-{uuid.uuid4().hex[:8]}", hier.version)
        self.cg.create(limit_bytes)
        self.events: list[dict[str, Any]] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.init_pid = 0
        self.restarts = 0
        self._closing = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def _spawn(self) -> None:
        procs = str(self.cg.path / "cgroup.procs")
        self.proc = subprocess.Popen(
            ["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs, "unshare", "--pid", "--fork"]
            + ["--mount-proc", "--kill-child", "--", *self.init],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
            except OSError:
                kids = ""
            if kids.split():
                self.init_pid = int(kids.split()[0])
                break
            time.sleep(0.01)
        else:
            raise RuntimeError("the local container's init did not start")
        self.events.append({"t": time.time(), "event": "start", "pid": self.init_pid})

    def start(self) -> LocalContainer:
        """Start PID 1, mark the container running and Ready in the fake, start the kubelet."""
        self._spawn()
        set_container(
            self.fake,
            self.ns,
            self.pod,
            self.container,
            ready=True,
            containerID=f"containerd://{uuid.uuid4().hex}",
            state={"running": {"startedAt": _now()}},
        )
        self._thread = threading.Thread(target=self._kubelet, daemon=True)
        self._thread.start()
        return self

    def _kubelet(self) -> None:
        while not self._closing and self.proc is not None:
            before = self.cg.oom_kills()
            rc = self.proc.wait()
            if self._closing:
                return
            oom = self.cg.oom_kills() > before
            t = time.time()
            cause = "oom" if oom else (f"signal:{-rc}" if rc < 0 else f"exit:{rc}")
            self.events.append(
                {"t": t, "event": "exit", "cause": cause, "oom_kills": self.cg.oom_kills()}
            )
            truth = kubelet_restart(
                self.fake,
                self.ns,
                self.pod,
                self.container,
                "OOMKilled" if oom else "Error",
                137 if oom or rc < 0 else rc,
                self.down_s,
                self.ready_s,
            )
            time.sleep(self.down_s)
            from chaoslib_infer.lab.cgroups import kill_tree

            kill_tree(self.cg.path, self.cg.version)  # what survived the init (nothing, normally)
            with self._lock:
                if self._closing:
                    return
                self._spawn()
                self.restarts += 1
            self.events.append({"t": time.time(), "event": "restart", "truth": truth})

    def close(self) -> None:
        """Kill every process of the container and remove its cgroup."""
        from chaoslib_infer.lab.cgroups import kill_tree, remove_tree

        with self._lock:
            self._closing = True
        kill_tree(self.cg.path, self.cg.version)
        if self.proc is not None:
            self.proc.wait(timeout=10)
        remove_tree(self.cg.path)

    # -- exec handler ------------------------------------------------------------------------
    def __call__(self, call: ExecCall) -> ExecReply:
        cmd = list(call.command)
        if cmd[0] == "python3":
            if not self.has_python:
                return ExecReply.not_found("python3")
            cmd[0] = sys.executable
        procs = str(self.cg.path / "cgroup.procs")
        r = subprocess.run(
            ["sh", "-c", 'p=$0; t=$1; shift; echo $$ > "$p" && exec nsenter -t "$t" -p -m -- "$@"']
            + [procs, str(self.init_pid), *cmd],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
        )
        return ExecReply(stdout=r.stdout, stderr=r.stderr, exit_code=r.returncode)

    # -- ground truth ------------------------------------------------------------------------
    def host_states(self) -> dict[int, str]:
        """``{host pid: state}`` of every process in the container's cgroup."""
        out = {}
        for pid in self.cg.pids():
            try:
                st = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            out[pid] = st[st.rindex(")") + 2]
        return out

    def ns_states(self) -> dict[int, str]:
        """``{pid as seen in the container: state}`` for the processes of its PID namespace,
        read from outside (``/proc/<host pid>/status`` ``NSpid`` and ``stat``)."""
        out = {}
        for pid in self.cg.pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                st = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            nspid = next(
                (ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), []
            )
            if len(nspid) == 2:
                out[int(nspid[1])] = st[st.rindex(")") + 2]
        return out

    def host_init_pid(self) -> int:
        return self.init_pid

    def in_cgroup(self) -> bool:
        return bool(self.cg.pids())


def running_as_root_with_memory_cgroup() -> str | None:
    """None when LocalContainer can run here, else why not (a skip reason starting with
    ``labutil.LAB_MISSING``: the CI gate fails such a skip)."""
    from labutil import LAB_MISSING

    if os.geteuid() != 0:
        return LAB_MISSING + "needs root (PID namespaces, a memory cgroup)"
    from chaoslib_infer.lab.cgroups import CgroupError, detect_hierarchy

    try:
        detect_hierarchy()
    except CgroupError as exc:
        return LAB_MISSING + str(exc)
    for tool in ("unshare", "nsenter"):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in ("/usr/bin", "/bin")):
            return LAB_MISSING + f"needs {tool} (util-linux)"
    return None


class ServiceProxy:
    """A Service's data path on loopback (see the module docstring).

    Args:
        fake: the fake API (its EndpointSlices of ``service`` in ``ns`` are read per request).
        ns, service: the Service.
        upstream: the engine's base URL (``http://127.0.0.1:PORT``), behind every pod.

    Attributes:
        url: the proxy's base URL once started; served: ``[(pod, unix s)]`` of every answer.
    """

    def __init__(self, fake: FakeK8s, ns: str, service: str, upstream: str) -> None:
        self.fake, self.ns, self.service = fake, ns, service
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", int(parts.port or 80))
        self.served: list[tuple[str, float]] = []
        self._next = 0
        self._lock = threading.Lock()
        self._server = QuietServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def ready_pods(self) -> list[str]:
        """The pod names of the Service's ready endpoints, sorted."""
        names = []
        for sl in self.fake.list("discovery.k8s.io", "endpointslices", self.ns):
            labels = sl["metadata"].get("labels") or {}
            if labels.get("kubernetes.io/service-name") != self.service:
                continue
            for ep in sl.get("endpoints") or []:
                if (ep.get("conditions") or {}).get("ready"):
                    names.append(str((ep.get("targetRef") or {}).get("name")))
        return sorted(names)

    def pick(self) -> str | None:
        """The next ready pod, round robin (None: no ready endpoint)."""
        pods = self.ready_pods()
        if not pods:
            return None
        with self._lock:
            self._next += 1
            return pods[self._next % len(pods)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                pod = proxy.pick()
                if pod is None:  # kube-proxy: no ready endpoint, the connection is refused
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                skip = {"host", "content-length", "connection"}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in (
                        "content-length",
                        "transfer-encoding",
                        "connection",
                        "x-replica-id",
                    ):
                        self.send_header(k, v)
                self.send_header("X-Replica-Id", pod)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                proxy.served.append((pod, time.time()))

            do_GET = _forward
            do_POST = _forward

        return Handler

    def __enter__(self) -> ServiceProxy:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
