"""Resolve where a drill reads and writes, from a Chaos Toolkit ``configuration`` mapping.

Keys (all optional, declared in every experiment's ``configuration`` block so ``--var`` can set them):

- ``infer_lab_dir``: state directory of the local lab (default ``$CHAOS_INFER_LAB_DIR`` or
  ``.chaos-infer/lab``).
- ``infer_run_dir``: where this drill writes its records and fault log (default
  ``$CHAOS_INFER_RUN_DIR`` or ``chaos-infer-run``).
- ``infer_base_url``: URL traffic goes to; default: the lab's HAProxy frontend.
- ``slo_<metric>``: overrides of the acceptance thresholds (see :mod:`chaoslib_infer.measure.slo`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from chaoslib.exceptions import InterruptExecution

DEFAULT_LAB_DIR = ".chaos-infer/lab"
DEFAULT_RUN_DIR = "chaos-infer-run"


#: in the run folder: why the load could not start (e.g. no request succeeded in warm-up);
#: written by the load controls, read by ``drill_run.run_drill`` to report it on the console and in
#: ``summary.json``
LOAD_ERROR_FILE = "load_error.txt"
#: in the run folder: what the service did when no request succeeded during the load's warm-up
#: (``{"finding", "url", "warmup_s"}``; ``controls.load.warmup_finding``): the drill runs on and
#: its verdict reads it (failed: the service did not meet its SLOs before the fault)
WARMUP_FILE = "warmup.json"


def _get(configuration: Mapping[str, Any] | None, key: str) -> Any:
    if not configuration:
        return None
    value = configuration.get(key)
    if isinstance(value, str) and value.startswith("${"):
        return None  # an undeclared --var leaves the placeholder in place
    return value


def lab_dir(configuration: Mapping[str, Any] | None) -> Path:
    """Return the lab state directory (absolute ``Path``) named by ``configuration`` or the env."""
    value = _get(configuration, "infer_lab_dir") or os.environ.get(
        "CHAOS_INFER_LAB_DIR", DEFAULT_LAB_DIR
    )
    return Path(str(value)).expanduser().resolve()


def run_dir(configuration: Mapping[str, Any] | None) -> Path:
    """Return (and create) the drill's run directory, where records and the fault log go."""
    value = _get(configuration, "infer_run_dir") or os.environ.get(
        "CHAOS_INFER_RUN_DIR", DEFAULT_RUN_DIR
    )
    path = Path(str(value)).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def load_error_saved(configuration: Mapping[str, Any] | None) -> Iterator[None]:
    """Save why the load could not start, for ``drill_run`` to report.

    An ``InterruptExecution`` raised inside the block has its message written to
    ``run_dir(configuration) / LOAD_ERROR_FILE`` (UTF-8; an ``OSError`` while writing is ignored)
    and is raised again unchanged; other exceptions pass through untouched.
    """
    try:
        yield
    except InterruptExecution as exc:
        with contextlib.suppress(OSError):
            (run_dir(configuration) / LOAD_ERROR_FILE).write_text(str(exc), encoding="utf-8")
        raise


def records_path(configuration: Mapping[str, Any] | None) -> Path:
    """Return the path of the per-attempt records file (JSONL) of the current drill."""
    return run_dir(configuration) / "records.jsonl"


def faults_path(configuration: Mapping[str, Any] | None) -> Path:
    """Return the path of the drill's fault log (JSONL: one line per injected fault)."""
    return run_dir(configuration) / "faults.jsonl"


def base_url(configuration: Mapping[str, Any] | None) -> str | None:
    """Return the explicit target URL, or ``None`` to use the lab's frontend."""
    value = _get(configuration, "infer_base_url") or os.environ.get("CHAOS_INFER_BASE_URL")
    return str(value).rstrip("/") if value else None


def target_url(configuration: Mapping[str, Any] | None) -> str:
    """The URL the drill's load goes to: ``infer_base_url`` when set, else the running lab's
    gateway (``url`` in ``<lab dir>/lab.json``), without a trailing slash.

    Raises:
        chaoslib.exceptions.InterruptExecution: neither is known (no URL set and no lab up); the
            experiment stops before any traffic is sent.
    """
    url = base_url(configuration)
    if url:
        return url
    lab_json = lab_dir(configuration) / "lab.json"
    try:
        return str(json.loads(lab_json.read_text(encoding="utf-8"))["url"]).rstrip("/")
    except (OSError, ValueError, KeyError) as exc:
        raise InterruptExecution(
            f"no target: set infer_base_url or bring the lab up ({lab_json} unreadable: {exc})"
        ) from exc


def slo_overrides(configuration: Mapping[str, Any] | None) -> dict[str, float]:
    """Return ``{metric: threshold}`` from ``slo_<metric>`` configuration keys (floats)."""
    out: dict[str, float] = {}
    for key, value in (configuration or {}).items():
        if key.startswith("slo_") and value not in (None, "") and not str(value).startswith("${"):
            out[key[4:]] = float(value)
    return out
