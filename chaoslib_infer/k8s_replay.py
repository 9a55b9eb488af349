"""Replay the Kubernetes rollbacks a killed drill left pending (``chaos-infer rollback --run-dir``).

Every Kubernetes fault that stays in place is saved by its action to
``<run dir>/k8s-state/<kind>.json`` *before* injection (see :mod:`chaoslib_infer.activities.k8s`),
with the target it was injected in (``k8s_target``: the target file's absolute path, the context
resolved at injection, the namespace); the action's rollback reads the file and removes it once the
fault is undone. A runner killed with SIGKILL (or a lost CI job, a closed laptop) never plays its
rollbacks, so the files stay: this module finds them and calls each kind's rollback activity, in
the same run dir, exactly as the drill would have.

Where the state files are looked for: ``RUN_DIR/k8s-state/`` and ``RUN_DIR/*/k8s-state/`` (a
game day's or ``drill run``'s ``--out`` folder holds one run dir per drill). Temporary files
(``*.tmp``: a save cut short, so nothing was injected after it) are ignored.

Safety: the target file must still exist, pass its allowlist (the rollback activity checks it
before any API call) and resolve to the context and namespace recorded at injection; otherwise that
entry fails with one line and nothing is sent. The order of replay is the reverse of the
injection order (newest state file first), as rollbacks are played. Each rollback is idempotent: a
second replay finds nothing and makes no API call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ROLLBACKS",
    "PendingK8sFault",
    "ReplayResult",
    "find_pending",
    "recover_previous_run",
    "replay",
]

#: State-file kind (``k8s-state/<kind>.json``) -> the rollback activity of
#: :mod:`chaoslib_infer.activities.k8s` that undoes it.
ROLLBACKS: dict[str, str] = {
    "quota-cut": "k8s_restore_quota",
    "node-loss": "k8s_uncordon_node",
    "node-taint": "k8s_remove_node_taint",
    "node-delete": "k8s_restore_node",
    "upstream-freeze": "k8s_thaw_model_server",
    "upstream-ingress": "k8s_restore_pod_ingress",
    "oom-kill": "k8s_stop_memory_hog",
    "network-jitter": "k8s_remove_network_jitter",
}

STATE_DIR = "k8s-state"


@dataclass
class PendingK8sFault:
    """One state file left in a run dir.

    Attributes:
        run_dir: the drill's run dir (``infer_run_dir`` of the drill that saved it).
        kind: the state kind (file stem), a key of :data:`ROLLBACKS` when known.
        path: the state file.
        state: its content (None when unreadable; ``error`` says why).
        error: why it cannot be replayed as it is (unknown kind, unreadable file), else None.
    """

    run_dir: Path
    kind: str
    path: Path
    state: dict[str, Any] | None
    error: str | None = None

    @property
    def rollback(self) -> str | None:
        """The name of the rollback activity, or None for an unknown kind."""
        return ROLLBACKS.get(self.kind)

    @property
    def target_file(self) -> str | None:
        """The target file recorded at injection (absolute), or None (an older state file)."""
        rec = (self.state or {}).get("k8s_target") or {}
        return str(rec["file"]) if rec.get("file") else None

    def describe(self) -> str:
        """One line: kind, what it changed, in which namespace / on which node."""
        s = self.state or {}
        ns = s.get("namespace") or (s.get("k8s_target") or {}).get("namespace") or "?"
        what = {
            "quota-cut": lambda: (
                ", ".join(
                    f"{k} {ns}/{s[k]['name']}"
                    for k in ("quota", "deployment", "hpa")
                    if isinstance(s.get(k), dict)
                )
                or "nothing saved"
            ),
            "node-loss": lambda: f"node {s.get('node')} cordoned",
            "node-taint": lambda: f"node {s.get('node')} tainted {s.get('key')}:{s.get('effect')}",
            "node-delete": lambda: f"node {s.get('node')} deleted",
            "upstream-freeze": lambda: (
                f"pod {ns}/{s.get('pod')} frozen (pids "
                + ",".join(str(t.get("pid")) for t in s.get("targets") or [])
                + ")"
            ),
            "upstream-ingress": lambda: (
                f"pod {ns}/{s.get('pod')} ingress blocked by networkpolicy {s.get('policy')}"
            ),
            "oom-kill": lambda: (
                f"memory hog in pod {ns}/{s.get('pod')}"
                + (f" (pid {s['hog'].get('pid')})" if isinstance(s.get("hog"), dict) else "")
            ),
            "network-jitter": lambda: (
                f"netem on pod {ns}/{s.get('pod')} (ephemeral container {s.get('container')})"
            ),
        }.get(self.kind)
        try:
            detail = what() if what else "unknown kind"
        except (KeyError, TypeError, AttributeError):
            detail = "state file of an unexpected shape"
        return f"{self.kind}: {detail}"


@dataclass
class ReplayResult:
    """What :func:`replay` found and did.

    Attributes:
        pending: the state files found (oldest last).
        undone: one line per rollback played (``<run dir>: <kind>: <what the rollback said>``).
        failed: one line per rollback that could not be played or failed (its file stays).
    """

    pending: list[PendingK8sFault] = field(default_factory=list)
    undone: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _run_dirs(root: Path) -> list[Path]:
    """``root`` when it holds a ``k8s-state`` folder, and its direct subfolders that do."""
    out = [root] if (root / STATE_DIR).is_dir() else []
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and p.name != STATE_DIR)
    except OSError:
        children = []
    out += [p for p in children if (p / STATE_DIR).is_dir()]
    return out


def find_pending(root: Path) -> list[PendingK8sFault]:
    """The state files under ``root`` (a drill's run dir, or a game day's ``--out`` folder).

    Args:
        root: an existing folder.

    Returns:
        One :class:`PendingK8sFault` per ``k8s-state/*.json``, newest first (by modification
        time: the reverse of injection order). An unreadable file or an unknown kind is returned
        with ``error`` set (never skipped silently: it may be a fault still in place).

    Raises:
        FileNotFoundError: ``root`` is not a folder.
    """
    root = Path(root).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    found: list[tuple[float, PendingK8sFault]] = []
    for run_dir in _run_dirs(root):
        for path in sorted((run_dir / STATE_DIR).glob("*.json")):
            kind = path.stem
            state: dict[str, Any] | None = None
            error = None
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                mtime = path.stat().st_mtime
            except FileNotFoundError:  # undone meanwhile (a rollback still running)
                continue
            except (OSError, ValueError) as exc:
                data, mtime = None, 0.0
                error = f"unreadable state file {path}: {exc}; fix or remove it by hand"
            if data is not None and not isinstance(data, dict):
                error = f"state file {path} is not a JSON object; fix or remove it by hand"
            elif isinstance(data, dict):
                state = data
            if error is None and kind not in ROLLBACKS:
                error = f"unknown fault kind {kind!r} in {path} (known: {', '.join(ROLLBACKS)})"
            found.append((mtime, PendingK8sFault(run_dir, kind, path, state, error)))
    found.sort(key=lambda item: -item[0])
    return [p for _, p in found]


def _check_target(fault: PendingK8sFault, target_file: str) -> str | None:
    """None when ``target_file`` still names what the state recorded, else why not (one line)."""
    from chaoslib_infer.errors import InferChaosError
    from chaoslib_infer.platforms.kubernetes.target import effective_context, load_target

    try:
        target = load_target(target_file)  # the allowlist too, before any API call
    except InferChaosError as exc:
        return str(exc)
    rec = (fault.state or {}).get("k8s_target") or {}
    context = effective_context(target)
    if rec.get("context") and rec["context"] != context:
        return (
            f"target file {target_file} now resolves to context {context!r}, but the fault was "
            f"injected in context {rec['context']!r}; refusing (switch the kubeconfig back)"
        )
    if rec.get("namespace") and rec["namespace"] != target.namespace:
        return (
            f"target file {target_file} now names namespace {target.namespace!r}, but the fault "
            f"was injected in {rec['namespace']!r}; refusing"
        )
    return None


def _activity(name: str) -> Callable[..., Any]:
    from chaoslib_infer.activities import k8s

    fn: Callable[..., Any] = getattr(k8s, name)
    return fn


def replay(
    root: Path,
    target_file: str | None = None,
    dry_run: bool = False,
) -> ReplayResult:
    """Play the rollback of every pending state file under ``root``.

    Each rollback activity is called with ``target_file`` = the file recorded in the state (else
    the ``target_file`` argument, else ``$CHAOS_INFER_K8S_TARGET``) and ``configuration`` =
    ``{"infer_run_dir": <the state's run dir>}``, so it reads, undoes and removes that state
    file, and appends its ``cleared`` line to that run dir's ``faults.jsonl``.

    Args:
        root: a drill's run dir or a game day's ``--out`` folder.
        target_file: the target for state files that do not record one (written before the
            target was recorded).
        dry_run: only list what would be undone (no API call, no file changed).

    Returns:
        A :class:`ReplayResult`; with ``dry_run``, ``undone`` holds ``would run ...`` lines.

    Raises:
        FileNotFoundError: ``root`` is not a folder.
    """
    from chaoslib.exceptions import ActivityFailed

    result = ReplayResult(pending=find_pending(root))
    fallback = target_file or os.environ.get("CHAOS_INFER_K8S_TARGET")

    for fault in result.pending:
        where = f"{fault.run_dir}: {fault.describe()}"
        if fault.error:
            result.failed.append(f"{fault.run_dir}: {fault.error}")
            continue
        target = fault.target_file or fallback
        if not target:
            result.failed.append(
                f"{where}: no target recorded in {fault.path.name}; pass --target TARGET.yaml"
            )
            continue
        problem = _check_target(fault, target)
        if problem:
            result.failed.append(f"{where}: {problem}")
            continue
        if dry_run:
            result.undone.append(f"{where}: would run {fault.rollback} (target {target})")
            continue
        name = str(fault.rollback)
        try:
            out = _activity(name)(
                target_file=target, configuration={"infer_run_dir": str(fault.run_dir)}
            )
        except ActivityFailed as exc:
            result.failed.append(f"{where}: {name} failed: {exc}")
            continue
        except Exception as exc:  # never a traceback: one line, the state file stays
            result.failed.append(f"{where}: {name} failed: {type(exc).__name__}: {exc}")
            continue
        text = "; ".join(str(x) for x in out) if isinstance(out, list) else str(out)
        if fault.path.exists():
            result.failed.append(f"{where}: {name} returned but left {fault.path}: {text}")
            continue
        result.undone.append(f"{where}: {name}: {text or 'nothing left to undo'}")
    return result


def recover_previous_run(out_dir: Path, target_file: str, progress: Callable[[str], None]) -> int:
    """A Kubernetes game day's start-up: replay what a killed earlier run left in ``out_dir``.

    Like the lab game day with its ledger, ``chaos-infer gameday --target FILE --out DIR`` plays
    the rollbacks of every ``DIR/k8s-state/`` and ``DIR/*/k8s-state/`` file left by a run that
    was killed (SIGKILL, a lost CI job) before its first drill, and says so: one ``safety:`` line,
    then one line per fault undone. States that record no target are replayed against
    ``target_file`` (the game day's); a recorded one is always used (allowlist checked again).

    Args:
        out_dir: the game day's ``--out`` folder (existing).
        target_file: the game day's target file.
        progress: where the lines go (the game day's console).

    Returns:
        How many faults were undone (0: nothing was pending, and no API call was made).

    Raises:
        InferChaosError: one line: a fault could not be undone (its state file stays, for
            ``chaos-infer rollback --run-dir``); the game day then starts no drill.
    """
    from chaoslib_infer.errors import InferChaosError

    pending = find_pending(out_dir)
    if not pending:
        return 0
    progress(
        f"safety: {len(pending)} Kubernetes fault(s) left by a previous run in {out_dir}: "
        "replaying their rollbacks before the first drill"
    )
    result = replay(out_dir, target_file=target_file)
    for line in result.undone:
        progress(f"safety:   undone: {line}")
    if result.failed:
        raise InferChaosError(
            f"could not undo {len(result.failed)} Kubernetes fault(s) left in {out_dir} by a "
            f"previous run: {result.failed[0]}; no drill started (chaos-infer rollback --run-dir "
            f"{out_dir} retries)"
        )
    return len(result.undone)
