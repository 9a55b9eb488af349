"""Run ``chaos-infer`` with one function made to fail right after it did its job.

Used by ``tests/test_interruptions.py`` (case "exception": an exception raised inside a drill's
action once its fault is in place)::

    python tests/_raise_after.py MODULE:QUALNAME drill run NAME --out DIR

``MODULE:QUALNAME`` names a function or method (``chaoslib_infer.lab.fleet:Lab.fault_event``).
Its first call runs the real function, then raises ``RuntimeError("injected failure")``; later
calls pass through (the rollback may call it again). Before raising it prints one line on stderr,
``raise_after: <target> raised; ledger kinds: [...]``, listing the kinds of the records in the
lab's fault ledger (``DIR/lab/faults.json``) and the Kubernetes states saved in
``DIR/*/k8s-state/`` at that instant: the fault is in place.

``!MODULE:QUALNAME`` raises *instead of* the first call (the real function never runs that
time): an exception in the middle of an action, e.g. while a Kubernetes action waits for its
fault to act (``tests/test_k8s_interruptions.py``).
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from pathlib import Path
from typing import Any


def _ledger_kinds(argv: list[str]) -> list[str]:
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
    if out is None:
        return []
    try:
        data = json.loads((out / "lab" / "faults.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [str(r.get("kind")) for r in data if isinstance(r, dict)]


def _k8s_states(argv: list[str]) -> list[str]:
    """The Kubernetes faults saved in ``DIR/*/k8s-state/`` at this instant (their kinds)."""
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
    return sorted(p.stem for p in out.glob("*/k8s-state/*.json")) if out else []


def patch(target: str, argv: list[str]) -> None:
    """Replace ``target`` (``MODULE:QUALNAME``) by a wrapper that raises after its first call.

    Raises:
        SystemExit: ``target`` is malformed or does not name a callable.
    """
    instead = target.startswith("!")
    module_name, sep, qualname = target.lstrip("!").partition(":")
    if not sep or not qualname:
        raise SystemExit(f"_raise_after: expected MODULE:QUALNAME, got {target!r}")
    owner: Any = importlib.import_module(module_name)
    *parents, attr = qualname.split(".")
    for name in parents:
        owner = getattr(owner, name)
    real = getattr(owner, attr)
    if not callable(real):
        raise SystemExit(f"_raise_after: {target} is not callable")
    raised: list[bool] = []

    @functools.wraps(real)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = None if instead and not raised else real(*args, **kwargs)
        if not raised:
            raised.append(True)
            print(
                f"raise_after: {target} raised; ledger kinds: {_ledger_kinds(argv)}; "
                f"k8s states: {_k8s_states(argv)}",
                file=sys.stderr,
                flush=True,
            )
            raise RuntimeError("injected failure")
        return result

    setattr(owner, attr, wrapper)


def main() -> None:
    """Patch ``sys.argv[1]``, then run the ``chaos-infer`` command line on the rest."""
    if len(sys.argv) < 3:
        raise SystemExit("usage: _raise_after.py MODULE:QUALNAME CHAOS-INFER-ARGS...")
    target, rest = sys.argv[1], sys.argv[2:]
    patch(target, rest)
    from chaoslib_infer.cli import main as cli_main

    sys.argv = ["chaos-infer", *rest]
    cli_main()


if __name__ == "__main__":
    main()
