"""Distributed load: N workers (local processes or a Kubernetes Indexed Job), one merged result.

A **worker** (``python -m chaoslib_infer.load.workers --shard K/N MODE ...``) runs shard ``K`` of
``N`` of a load run: the soak (``soak.run_soak``) or the ramp and burst of the three-phase test
(``phases.run_three_phase``) at ``1/N`` of the rate and concurrency, with its own seed
(``seed * 1000 + K``, as :mod:`.shard` does, so the union of the shards' Poisson schedules is a
Poisson schedule at the full rate). It writes its records (``<out-dir>/shard-K/``), builds HDR
histograms of them (:class:`.soak.StreamStats`: E2E, TTFT, ITL, TPOT, send lag; 1 us, 3
significant digits) and prints one line ``CHAOS_INFER_WORKER_RESULT {json}`` on stdout with the
histograms (HdrHistogram's compressed base64 encoding) and counts. In a pod, that line is read
back from the pod's log through the API: no shared volume is needed.

The **runner** starts the workers and merges their results: HDR histograms add bucket by bucket
(exact), counts add, so the merged percentiles equal those one process computes over the union
of the records (``tests/test_workers.py`` checks it) at the histogram's precision.

- :func:`run_local` starts N worker processes on this machine (``--workers N --local``) and also
  concatenates their record files (``records.jsonl`` / ``<step>.jsonl``);
- :func:`chaoslib_infer.platforms.kubernetes.load_job.run_k8s` runs them as a Kubernetes Indexed
  Job in the runner's namespace and merges the pods' results (there, so the load package does
  not import the Kubernetes plumbing).

Workers are started together and begin at a common instant (``--start-at``, unix seconds), so
their ramp steps and bursts overlap to within one request's latency. The three-phase test's
single stream is one stream by definition: it runs as a first stage with one worker, then the
ramp and burst run on N.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from .records import iter_records
from .soak import StreamStats
from .worker_results import MARKER as MARKER
from .worker_results import decode_stats as decode_stats
from .worker_results import encode_stats as encode_stats
from .worker_results import merge_results as merge_results
from .worker_results import merge_stats as merge_stats
from .worker_results import parse_result as parse_result

__all__ = [
    "MARKER",
    "decode_stats",
    "encode_stats",
    "job_manifest",
    "main",
    "merge_results",
    "merge_stats",
    "parse_result",
    "run_local",
    "shard_share",
    "stage_timeout",
    "stages",
    "worker_args",
]

PROG = "python -m chaoslib_infer.load.workers"
_MODES = ("soak", "three-phase")


def _file_stats(path: Path) -> StreamStats:
    st = StreamStats()
    if path.exists():
        for r in iter_records(path):
            st.add(r)
    return st


def shard_share(total: int, k: int, n: int) -> int:
    """Shard ``k``'s part of ``total`` split over ``n`` (the first ``total % n`` get one more)."""
    return total // n + (1 if k < total % n else 0)


# -- the worker --------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The worker's argument parser (exposed for documentation and tests)."""
    p = _Parser(prog=PROG, description="One shard of a distributed load run; prints its result.")
    p.add_argument("mode", choices=_MODES)
    p.add_argument(
        "--shard",
        required=True,
        metavar="K/N",
        help="this worker's index K (0-based; a non-number reads $JOB_COMPLETION_INDEX) of N",
    )
    p.add_argument("--url", required=True)
    p.add_argument("--out-dir", required=True, help="records go to OUT_DIR/shard-K/")
    p.add_argument("--start-at", type=float, default=None, help="unix s to start at (aligned)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="chaos-sim")
    p.add_argument("--timeout-s", type=float, default=60.0)
    # soak
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--rate", type=float, default=1.0, help="total rate of all shards, req/s")
    p.add_argument("--mix", default="short:70,mid:25,long:5")
    p.add_argument("--burstiness", default="poisson")
    p.add_argument("--headroom", type=float, default=1.0)
    p.add_argument("--lag-p99-max-ms", type=float, default=50.0)
    p.add_argument("--max-concurrency", type=int, default=1024, help="total of all shards")
    p.add_argument("--max-tokens-scale", type=float, default=1.0)
    # three-phase
    p.add_argument("--single-n", type=int, default=0)
    p.add_argument("--ramp", default="", help="total concurrencies, comma-separated")
    p.add_argument("--step-s", type=float, default=30.0)
    p.add_argument("--burst-rps", type=float, default=None, help="total burst rate")
    p.add_argument("--burst-s", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=32)
    return p


def _parse_shard(text: str) -> tuple[int, int]:
    k_text, sep, n_text = text.partition("/")
    if not sep:
        raise ValueError(f"--shard {text!r}: expected K/N")
    if not k_text.strip().isdigit():  # $(JOB_COMPLETION_INDEX) not expanded: read it
        k_text = os.environ.get("JOB_COMPLETION_INDEX", "")
    try:
        k, n = int(k_text), int(n_text)
    except ValueError:
        raise ValueError(f"--shard {text!r}: K and N must be integers") from None
    if not (n >= 1 and 0 <= k < n):
        raise ValueError(f"--shard {text!r}: expected 0 <= K < N")
    return k, n


def _run_worker(args: argparse.Namespace, k: int, n: int) -> dict[str, Any]:
    out = Path(args.out_dir) / f"shard-{k}"
    out.mkdir(parents=True, exist_ok=True)
    if args.start_at is not None:  # a common start: bounded wait (a late pod starts at once)
        time.sleep(min(max(args.start_at - time.time(), 0.0), 300.0))
    seed = args.seed * 1000 + k
    result: dict[str, Any] = {"mode": args.mode, "shard": k, "of": n, "started_at": time.time()}
    if args.mode == "soak":
        from .soak import SoakSpec, parse_burstiness, parse_mix, run_soak

        spec = SoakSpec(
            url=args.url, duration_s=args.duration_s, rate_rps=args.rate / n,
            mix=parse_mix(args.mix), gamma_shape=parse_burstiness(args.burstiness),
            headroom=args.headroom, max_concurrency=max(1, args.max_concurrency // n),
            lag_p99_max_s=args.lag_p99_max_ms / 1000, seed=seed, model=args.model,
            timeout_s=args.timeout_s, max_tokens_scale=args.max_tokens_scale,
        )  # fmt: skip
        report = run_soak(spec, out)
        report.pop("stats", None)
        result["report"] = report
        result["stats"] = encode_stats(_file_stats(out / "records.jsonl"))
    else:
        from .phases import ThreePhaseSpec, run_three_phase

        ramp = tuple(int(x) for x in args.ramp.split(",") if x.strip())
        mine = tuple(shard_share(c, k, n) for c in ramp)
        if any(c < 1 for c in mine):
            raise ValueError(f"--ramp {args.ramp}: every step needs at least {n} (one per shard)")
        tspec = ThreePhaseSpec(
            url=args.url, single_n=args.single_n if k == 0 else 0, ramp=mine,
            step_s=args.step_s,
            burst_rps=args.burst_rps / n if args.burst_rps is not None else None,
            burst_s=args.burst_s, max_tokens=args.max_tokens, model=args.model,
            timeout_s=args.timeout_s,
        )  # fmt: skip
        report = run_three_phase(tspec, out)
        totals = iter(ramp)  # name ramp steps by their total concurrency, as one process would
        result["steps"] = [
            {
                "step": f"ramp-{next(totals)}" if s["kind"] == "ramp" else s["step"],
                "kind": s["kind"],
                "start_at": s["start_at"],
                "end_at": s["end_at"],
                "rate_rps": s.get("rate_rps"),
                "stats": encode_stats(_file_stats(Path(s["records"]))),
            }
            for s in report["steps"]
        ]
    result["ended_at"] = time.time()
    return result


def main(argv: list[str] | None = None) -> int:
    """Worker entry point; returns 0 (result line printed) or 2 (bad arguments or a failed run,
    one line on stderr)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        k, n = _parse_shard(args.shard)
        result = _run_worker(args, k, n)
    except (ValueError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(MARKER + json.dumps(result, separators=(",", ":")), flush=True)
    return 0


# -- the runner ---------------------------------------------------------------------------------


def worker_args(mode: str, params: Mapping[str, Any], n: int, index: str | int) -> list[str]:
    """The worker's arguments (after ``python -m chaoslib_infer.load.workers``) for shard ``index``
    (an int, or ``"$(JOB_COMPLETION_INDEX)"`` in a Job) of ``n``; ``params`` maps option names
    without dashes (``url``, ``rate``, ``duration_s``...) to values (None: left out)."""
    out = [mode, "--shard", f"{index}/{n}"]
    for key, value in params.items():
        if value is None:
            continue
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out


def stage_timeout(mode: str, params: Mapping[str, Any]) -> float:
    """Upper bound of one stage's duration in seconds (schedule + drain + start-up)."""
    t = float(params.get("timeout_s") or 60.0)
    if mode == "soak":
        work = float(params.get("duration_s") or 0.0)
    else:
        steps = [x for x in str(params.get("ramp") or "").split(",") if x.strip()]
        work = len(steps) * float(params.get("step_s") or 0.0) + float(params.get("burst_s") or 0.0)
        work += float(params.get("single_n") or 0) * t
    return work + 2 * t + 60.0


def stages(mode: str, params: Mapping[str, Any], n: int) -> list[tuple[dict[str, Any], int]]:
    """``[(params, workers)]``: the three-phase single stream first on one worker."""
    if mode == "three-phase" and int(params.get("single_n") or 0) > 0 and n > 1:
        single = {**params, "ramp": "", "burst_s": 0.0}
        rest = {**params, "single_n": 0}
        return [(single, 1), (rest, n)]
    return [(dict(params), n)]


def run_local(
    mode: str,
    params: Mapping[str, Any],
    n: int,
    out_dir: Path,
    log: Callable[[str], None] = lambda _m: None,
    start_delay_s: float = 2.0,
) -> dict[str, Any]:
    """Run ``n`` worker processes on this machine, merge their results (and record files).

    Args:
        mode: ``"soak"`` or ``"three-phase"``.
        params: worker options (see :func:`worker_args`; ``url`` required; totals, not shares).
        n: workers (>= 1).
        out_dir: where the shards write and ``report.json`` goes (created).
        log: progress line sink.
        start_delay_s: the common start is this many seconds after the processes are started.

    Returns:
        The merged report (:func:`merge_results`), also written to ``out_dir/report.json``.

    Raises:
        RuntimeError: a worker failed, overran its bound (it is killed) or printed no result.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for stage_params, workers in stages(mode, params, n):
        stage = {**stage_params, "out_dir": str(out_dir), "start_at": time.time() + start_delay_s}
        bound = time.monotonic() + stage_timeout(mode, stage) + start_delay_s
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "chaoslib_infer.load.workers",
                    *worker_args(mode, stage, workers, k),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for k in range(workers)
        ]
        log(f"workers: {workers} local process(es) started ({mode})")
        errors: list[str] = []
        stage_results: list[dict[str, Any]] = []
        for k, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=max(1.0, bound - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
                errors.append(f"worker {k} overran its bound and was killed")
                continue
            res = parse_result(out)
            if p.returncode != 0 or res is None:
                tail = (err.strip().splitlines() or ["no output"])[-1]
                errors.append(f"worker {k} exited {p.returncode}: {tail}")
                continue
            stage_results.append(res)
        if errors:
            raise RuntimeError("; ".join(errors))
        results += stage_results
    report = merge_results(mode, results, n)
    if mode == "soak":
        from .shard import merge_record_files

        files = sorted(out_dir.glob("shard-*/records.jsonl"))
        report["records"] = merge_record_files(files, out_dir / "records.jsonl")
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def job_manifest(
    name: str,
    namespace: str,
    image: str,
    mode: str,
    params: Mapping[str, Any],
    n: int,
    deadline_s: int,
) -> dict[str, Any]:
    """The Indexed Job running ``n`` workers (``batch/v1``).

    Each pod runs ``python -m chaoslib_infer.load.workers MODE --shard $(JOB_COMPLETION_INDEX)/N
    ...`` (the kubelet expands ``$(JOB_COMPLETION_INDEX)``, which the Job controller sets in
    every container), writes its records to an ``emptyDir`` and prints its result line to its
    log. No service-account token is mounted: the workers only send traffic.
    """
    args = worker_args(mode, {**params, "out_dir": "/work/out"}, n, "$(JOB_COMPLETION_INDEX)")
    labels = {"app.kubernetes.io/name": "chaos-infer-load", "app.kubernetes.io/instance": name}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": n,
            "parallelism": n,
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline_s,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": {"runAsNonRoot": True},
                    "containers": [
                        {
                            "name": "worker",
                            "image": image,
                            "command": ["python", "-m", "chaoslib_infer.load.workers"],
                            "args": args,
                            "volumeMounts": [{"name": "out", "mountPath": "/work/out"}],
                            "resources": {
                                "requests": {"cpu": "1", "memory": "512Mi"},
                                "limits": {"memory": "1Gi"},
                            },
                        }
                    ],
                    "volumes": [{"name": "out", "emptyDir": {}}],
                },
            },
        },
    }


if __name__ == "__main__":
    sys.exit(main())
