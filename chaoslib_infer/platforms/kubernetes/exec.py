"""Run a command in a container through the ``pods/exec`` subresource (what ``kubectl exec`` does).

The official client's :func:`kubernetes.stream.stream` opens a WebSocket on
``GET /api/v1/namespaces/{ns}/pods/{pod}/exec?command=...&container=...`` (subprotocol
``v5.channel.k8s.io``, else ``v4.channel.k8s.io``). The API server answers on numbered channels:
1 stdout, 2 stderr, 3 the command's end as a ``Status`` JSON document (``{"status": "Success"}``,
or ``"Failure"`` with ``details.causes[{"reason": "ExitCode", "message": "<n>"}]`` for a non-zero
exit, or without an exit code when the command could not start, e.g. ``executable file not found
in $PATH``).

RBAC: ``pods/exec`` with ``get`` (the WebSocket upgrade is an HTTP GET) **and** ``create``
(Kubernetes 1.35+ also checks ``create`` for WebSocket upgrades, feature gate
``AuthorizePodWebsocketUpgradeCreatePermission``, beta and on by default).

Scripts: the fault actions run small programs in the model-server container without extra tools.
:func:`run_script` tries ``python3 -c`` first (vLLM, SGLang and TGI images ship Python), and falls
back to ``sh -c`` (POSIX shell builtins only, plus ``head``/``tail`` for the memory hog) when the
image has no ``python3``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from chaoslib_infer.platforms.kubernetes import K8sError, api_error_line
from chaoslib_infer.safety.redact import clip
from chaoslib_infer.safety.signals import held_interrupts

__all__ = [
    "INTERPRETERS",
    "ExecResult",
    "exec_in_container",
    "parse_exec_status",
    "run_script",
]

#: Interpreters tried by :func:`run_script`, in order.
INTERPRETERS = ("python3", "sh")
_HANDSHAKE = re.compile(r"Handshake status (\d{3})")
_NOT_FOUND = ("executable file not found", "no such file or directory", "not found in $path")


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one exec.

    Attributes:
        command: the argv that was run.
        stdout, stderr: what the command wrote (UTF-8 text).
        exit_code: its exit status; None when it did not run (``message`` says why).
        message: the Failure message of the status channel ('' on success).
    """

    command: list[str]
    stdout: str
    stderr: str
    exit_code: int | None
    message: str = ""
    lines: list[str] = field(default_factory=list)

    @property
    def not_found(self) -> bool:
        """True when the executable does not exist in the image (exit 126/127 or runtime error)."""
        text = (self.message + " " + self.stderr).lower()
        return self.exit_code in (126, 127) or (
            self.exit_code is None and any(s in text for s in _NOT_FOUND)
        )


def parse_exec_status(text: str) -> tuple[int | None, str]:
    """Decode the status channel (3) of an exec.

    Args:
        text: the channel's content, a Kubernetes ``Status`` JSON document ('' when none came).

    Returns:
        ``(exit_code, message)``: ``(0, "")`` for Success; ``(n, message)`` for a non-zero exit;
        ``(None, message)`` when the command did not run or no status arrived.
    """
    if not text.strip():
        return None, "the exec ended without a status (connection closed early)"
    try:
        doc = json.loads(text)
    except ValueError:
        return None, f"unreadable exec status: {clip(text.strip(), 200)}"
    if doc.get("status") == "Success":
        return 0, ""
    message = str(doc.get("message") or doc.get("reason") or "Failure")
    for cause in (doc.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message")), message
            except (TypeError, ValueError):
                break
    return None, message


def _handshake_error(exc: Any, what: str) -> K8sError:
    """Turn the client's ``ApiException(status=0, reason="Handshake status 403 ...")`` into one line."""
    inner = exc.__context__
    status = getattr(inner, "status_code", None)
    body: Any = getattr(inner, "resp_body", None)
    text = str(getattr(exc, "reason", "") or exc)
    if status is None:
        m = _HANDSHAKE.search(text)
        status = int(m.group(1)) if m else 0
        body = text.rsplit(" -+-+- ", 1)[-1] if m else None
    if status:
        return K8sError(api_error_line(int(status), what, body), int(status))
    return K8sError(f"{what}: API server unreachable: {text.splitlines()[0] if text else exc}")


def exec_in_container(
    core: Any,
    namespace: str,
    pod: str,
    container: str,
    command: list[str],
    timeout_s: float = 30.0,
) -> ExecResult:
    """Run ``command`` in ``container`` of ``pod`` and wait for it to end (bounded).

    Args:
        core: ``CoreV1Api``.
        namespace, pod, container: where to run it.
        command: argv (not run through a shell).
        timeout_s: bound on the whole exec, seconds. SIGINT/SIGTERM arriving meanwhile are
            held until the exec ends (:func:`~chaoslib_infer.safety.signals.held_interrupts`),
            then delivered: never lost inside the client.

    Returns:
        The :class:`ExecResult` (a non-zero exit is a result, not an error).

    Raises:
        K8sError: the upgrade was refused (403 missing ``pods/exec`` permission, 404 pod absent,
            400 container not running / unknown), the connection broke, or the command did not
            end within ``timeout_s``.
    """
    from kubernetes.client.exceptions import ApiException
    from kubernetes.stream import stream
    from websocket import WebSocketException

    what = f"exec {command[0]} in pod {namespace}/{pod} (container {container})"
    # A Ctrl-C / SIGTERM inside the WebSocket handshake is turned into "API server unreachable"
    # by the client (the interruption is lost and the drill goes on); held, it is delivered
    # once the exec has ended (bounded by timeout_s; a second signal is not held).
    with held_interrupts():
        try:
            ws = stream(
                core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                command=command,
                container=container,
                stdin=False,
                stdout=True,
                stderr=True,
                tty=False,
                _preload_content=False,
            )
        except ApiException as exc:
            raise _handshake_error(exc, what) from None
        try:
            ws.run_forever(timeout=timeout_s)
            if ws.is_open():
                raise K8sError(f"{what}: did not finish within {timeout_s:g} s")
            stdout = str(ws.read_channel(1) or "")
            stderr = str(ws.read_channel(2) or "")
            status = str(ws.read_channel(3) or "")
        except (WebSocketException, OSError) as exc:
            raise K8sError(f"{what}: connection lost: {exc}") from None
        finally:
            ws.close()
    code, message = parse_exec_status(status)
    return ExecResult(
        list(command), stdout, stderr, code, message, [ln for ln in stdout.splitlines() if ln]
    )


def run_script(
    core: Any,
    namespace: str,
    pod: str,
    container: str,
    scripts: dict[str, str],
    args: list[str],
    interpreter: str | None = None,
    timeout_s: float = 30.0,
) -> tuple[str, ExecResult]:
    """Run one program, given as a Python and a POSIX-shell version, with the first interpreter found.

    ``python3 -c PY ARGS...`` is tried first; when the image has no ``python3`` (the runtime
    answers "executable file not found", or exit 126/127), ``sh -c SH sh ARGS...``.

    Args:
        core: ``CoreV1Api``. namespace, pod, container: where.
        scripts: ``{"python3": source, "sh": source}``.
        args: the program's arguments (``sys.argv[1:]`` / ``"$@"``).
        interpreter: use only this one (the one that worked at injection, for the rollback).
        timeout_s: bound on each exec, seconds.

    Returns:
        ``(interpreter, result)``.

    Raises:
        K8sError: the exec was refused (see :func:`exec_in_container`), or neither interpreter
            exists in the image.
    """
    tried = []
    for name in (interpreter,) if interpreter else INTERPRETERS:
        argv = ["python3", "-c", scripts["python3"], *args]
        if name == "sh":
            argv = ["sh", "-c", scripts["sh"], "sh", *args]
        result = exec_in_container(core, namespace, pod, container, argv, timeout_s)
        if not result.not_found:
            return name, result
        tried.append(f"{name}: {clip((result.message or result.stderr).strip(), 160)}")
    raise K8sError(
        f"pod {namespace}/{pod} container {container}: no usable interpreter ({'; '.join(tried)})"
    )
