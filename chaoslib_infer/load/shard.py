"""Sharded open-loop load: one phase split across processes, per-shard record files merged.

``run_sharded`` starts ``shards`` processes of ``python -m chaoslib_infer.load``, each at
``rate / shards`` with its own seed (so the union of their Poisson schedules is a Poisson schedule
at the full rate) and its own records file ``shard-K.jsonl``; it waits for all of them (bounded by
the phase's duration plus the drain bound) and concatenates the shard files into one merged file.

Percentiles of a sharded run must equal those one process would compute over the same records:
``e2e_histogram`` builds an HDR histogram per shard file, ``merge_histograms`` adds them (HDR
histograms merge exactly, bucket by bucket), and the result equals the histogram of the merged
file; ``tests/test_ceiling.py`` checks it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram

from .records import iter_records

__all__ = ["e2e_histogram", "merge_histograms", "merge_record_files", "run_sharded"]

_US = 1_000_000
_MAX_US = 3600 * _US


def _new() -> HdrHistogram:
    return HdrHistogram(1, _MAX_US, 3)


def e2e_histogram(records: Iterable[Mapping[str, Any]]) -> HdrHistogram:
    """HDR histogram (1 us, 3 significant digits) of E2E (``end_at - sent_at``) of ok records."""
    h = _new()
    for r in records:
        if r.get("ok") and isinstance(r.get("end_at"), int | float):
            us = int(round((r["end_at"] - r["sent_at"]) * _US))
            h.record_value(min(max(us, 1), _MAX_US))
    return h


def merge_histograms(hists: Iterable[HdrHistogram]) -> HdrHistogram:
    """Sum of HDR histograms (exact: same bucket layout)."""
    out = _new()
    for h in hists:
        out.add(h)
    return out


def merge_record_files(paths: Sequence[Path], out: Path) -> int:
    """Concatenate records files (byte copy, line by line, a truncated last line dropped).

    Returns:
        Number of records written.
    """
    n = 0
    with open(out, "w", encoding="utf-8") as fh:
        for p in paths:
            for rec in iter_records(p):
                fh.write(json.dumps(rec, separators=(",", ":"), ensure_ascii=False) + "\n")
                n += 1
    return n


def run_sharded(
    url: str,
    rate_rps: float,
    duration_s: float,
    shards: int,
    out_dir: Path,
    max_concurrency: int = 256,
    max_tokens: int = 32,
    timeout_s: float = 30.0,
    seed: int = 0,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Run one open-loop phase across ``shards`` processes and merge their records.

    Args:
        url: base URL of the target.
        rate_rps: total arrival rate, requests/s.
        duration_s: schedule length, seconds.
        shards: processes (>= 1).
        out_dir: directory for ``shard-K.jsonl`` and ``merged.jsonl`` (created).
        max_concurrency: in-flight cap of all shards together (split evenly).
        max_tokens: output tokens per request.
        timeout_s: per-attempt timeout, seconds.
        seed: base seed; shard K uses ``seed * 1000 + K``.
        extra_args: further ``python -m chaoslib_infer.load`` flags.

    Returns:
        ``{"shards", "records", "merged" (path), "shard_files", "summaries"}`` where
        ``summaries`` are the shards' JSON summary lines.

    Raises:
        RuntimeError: a shard exited non-zero or overran its bound (it is killed first).
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / f"shard-{k}.jsonl" for k in range(shards)]
    procs = []
    for k, f in enumerate(files):
        cmd = [
            sys.executable, "-m", "chaoslib_infer.load", "--url", url,
            "--rate", f"{rate_rps / shards:.6f}", "--duration-s", str(duration_s),
            "--out", str(f), "--seed", str(seed * 1000 + k),
            "--max-concurrency", str(max(1, max_concurrency // shards)),
            "--max-tokens", str(max_tokens), "--timeout-s", str(timeout_s),
            "--progress-s", "3600", *extra_args,
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    bound = time.monotonic() + duration_s + timeout_s + 30.0
    summaries: list[dict[str, Any]] = []
    errors: list[str] = []
    for k, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, bound - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            errors.append(f"shard {k} overran its bound and was killed")
            continue
        if p.returncode != 0:
            errors.append(f"shard {k} exited {p.returncode}: {err.strip()[-200:]}")
            continue
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        summaries.append(json.loads(lines[-1]) if lines else {})
    if errors:
        raise RuntimeError("; ".join(errors))
    merged = out_dir / "merged.jsonl"
    n = merge_record_files(files, merged)
    return {
        "shards": shards,
        "records": n,
        "merged": str(merged),
        "shard_files": [str(f) for f in files],
        "summaries": summaries,
    }
