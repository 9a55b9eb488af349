"""Run the certification phases against one target and measure them.

Phases (``drills/certification.yaml``), each writing ``<target>/<phase>/records.jsonl`` (one
record per attempt, contracts.md section 3):

1. ``single``: sequential requests (unloaded latency);
2. ``ramp``: closed-loop steps at each concurrency (peak successful req/s, P99 jump flags);
3. ``burst``: open loop at ``base_fraction`` x the ramp's peak, then ``factor`` x the peak for
   ``burst_s``, then the base rate again; recovery after the burst ends;
4. ``soak``: Poisson arrivals with a short/mid/long prompt mixture (one open-loop run per class,
   superposed); invalid when the schedule lag P99 exceeds the plan's limit;
5. ``jitter``: network jitter in our own transport (:class:`JitterProxy`) inside a window, with
   retries; recovery after the window;
6. ``timeouts``: the business timeout per attempt with retries.

Figures are computed from the records with ``chaoslib_infer.measure`` (definitions of
``docs/definitions.md``): attempt statistics (``window_stats``), logical statistics for phases
with retries (``logical_stats``), retries (``retry_stats``), recovery (``figures.recovery``).
**Possible duplicate generations** (client side, no provider access): logical requests with an
attempt that got a 200 and was then cut by our timeout or a dropped stream and retried: the
provider had started generating it and generated it again (and likely billed both). Against the
lab engine this is an upper bound of the engine ledger's exact count.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaoslib_infer.load.client import (
    DEFAULT_RETRY_ON,
    LoadSpec,
    build_body,
    logical_request_id,
    make_session,
    run_load,
    send_attempt,
)
from chaoslib_infer.load.records import RecordWriter, read_records
from chaoslib_infer.measure.figures import recovery
from chaoslib_infer.measure.metrics import logical_stats, retry_stats, select, window_stats
from chaoslib_infer.measure.slo import Thresholds, evaluate
from chaoslib_infer.platforms.endpoint import EndpointTarget, JitterProxy

from .plan import CertPlan

__all__ = ["possible_duplicates", "run_phases"]

Log = Callable[[str], None]


def possible_duplicates(records: list[dict[str, Any]]) -> int:
    """Logical requests the provider may have generated more than once (module docstring).

    An attempt counts as started on the provider when it got HTTP 200 (the stream was open);
    a request is a possible duplicate when such an attempt is followed by another attempt.
    """
    by_id: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_id.setdefault(str(r.get("request_id")), []).append(r)
    n = 0
    for attempts in by_id.values():
        attempts.sort(key=lambda r: int(r.get("attempt") or 1))
        started = [a for a in attempts[:-1] if a.get("status") == 200 and not a.get("ok")]
        if started:
            n += 1
    return n


def _base_spec(target: EndpointTarget, plan: CertPlan, include_usage: bool, **kw: Any) -> LoadSpec:
    req = plan.request
    base: dict[str, Any] = dict(
        url=target.chat_url,
        model=target.model,
        max_tokens=req["max_tokens"],
        prompt_words=req["prompt_words"],
        timeout_s=req["timeout_s"],
        ttft_timeout_s=req["timeout_s"],
        idle_timeout_s=req["timeout_s"],
        headers=target.headers(),
        include_usage=include_usage,
        extra_body=dict(target.extra_body),
    )
    base.update(kw)
    return LoadSpec(**base)


def _held(records: list[dict[str, Any]], start: float, end: float, slo: Thresholds,
          logical: bool) -> tuple[bool | None, list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """The post-fault hypothesis: the SLO rows over ``[start, end)``."""
    stats = logical_stats(records, start, end) if logical else window_stats(records, start, end)
    if not stats["requests"]:
        return None, [], stats
    rows = evaluate(stats, slo)
    return all(r["passed"] for r in rows), rows, stats


async def _sequential(spec: LoadSpec, n: int, writer: RecordWriter) -> None:
    rng = random.Random(spec.seed)
    run = f"{random.getrandbits(32):08x}"
    async with make_session(spec) as session:
        for i in range(n):
            body = json.dumps(build_body(spec, rng)).encode()
            writer.write(await send_attempt(session, spec, body, logical_request_id(run, i)))


async def _closed_loop(spec: LoadSpec, concurrency: int, duration_s: float,
                       writer: RecordWriter) -> None:  # fmt: skip
    rng = random.Random(spec.seed + concurrency)
    run = f"{random.getrandbits(32):08x}"
    end = time.perf_counter() + duration_s
    count = 0
    async with make_session(spec) as session:

        async def worker() -> None:
            nonlocal count
            while time.perf_counter() < end:
                i = count
                count += 1
                body = json.dumps(build_body(spec, rng)).encode()
                writer.write(await send_attempt(session, spec, body, logical_request_id(run, i)))

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def _phase(name: str, kind: str, rel: str, start: float, end: float) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "records": rel,
        "started_at": start,
        "ended_at": end,
        "stats": {},
        "figures": {},
        "slo": [],
        "held": None,
        "markers": [],
        "notes": [],
    }


def _records_file(d: Path, phase: str) -> Path:
    """``d/<phase>/records.jsonl``, its folder created."""
    path = d / phase / "records.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _common(ph: dict[str, Any], records: list[dict[str, Any]]) -> None:
    st = window_stats(records)
    ph["stats"] = st
    span = max(ph["ended_at"] - ph["started_at"], 1e-9)
    ph["figures"].update(
        requests=st["requests"],
        availability=st["availability"],
        error_rate=st["error_rate"],
        timeout_rate=st["timeout_rate"],
        p50_e2e_s=st["p50_e2e_s"],
        p99_e2e_s=st["p99_e2e_s"],
        p50_ttft_s=st["p50_ttft_s"],
        ok_rps=st["ok"] / span,
    )


async def _single(target: EndpointTarget, plan: CertPlan, d: Path, iu: bool, log: Log
                  ) -> dict[str, Any]:  # fmt: skip
    cfg = plan.phases["single"]
    path = _records_file(d, "single")
    t0 = time.time()
    with RecordWriter(path) as w:
        await _sequential(_base_spec(target, plan, iu, seed=1), int(cfg["requests"]), w)
    ph = _phase("single", "steady", "single/records.jsonl", t0, time.time())
    recs = read_records(path)
    _common(ph, recs)
    ph["slo"] = evaluate(ph["stats"], plan.slo)
    log(f"  single: {len(recs)} sequential requests, P50 {ph['figures']['p50_e2e_s']}")
    return ph


async def _ramp(target: EndpointTarget, plan: CertPlan, d: Path, iu: bool, log: Log
                ) -> dict[str, Any]:  # fmt: skip
    from chaoslib_infer.load.phases import flag_steps

    cfg = plan.phases["ramp"]
    path = _records_file(d, "ramp")
    t_start = time.time()
    bounds = []
    with RecordWriter(path) as w:
        for c in cfg["concurrency"]:
            t0 = time.time()
            spec = _base_spec(target, plan, iu, max_concurrency=max(c, 1), seed=2)
            await _closed_loop(spec, int(c), float(cfg["step_s"]), w)
            bounds.append((int(c), t0, time.time()))
    ph = _phase("ramp", "steady", "ramp/records.jsonl", t_start, time.time())
    recs = read_records(path)
    _common(ph, recs)
    steps: list[dict[str, Any]] = []
    for c, t0, t1 in bounds:
        st = window_stats(recs, t0, t1)
        st["ok_rps"] = st["ok"] / max(t1 - t0, 1e-9)
        steps.append({"step": f"c{c}", "kind": "ramp", "concurrency": c, "start_at": t0,
                      "end_at": t1, "stats": st, "flags": []})  # fmt: skip
        ph["markers"].append((t0, f"c={c}", "#666666"))
    flag_steps(steps)
    ph["steps"] = [
        {"concurrency": s["concurrency"], "start_at": s["start_at"], "end_at": s["end_at"],
         "requests": s["stats"]["requests"],
         "ok_rps": s["stats"]["ok_rps"], "error_rate": s["stats"]["error_rate"],
         "p50_e2e_s": s["stats"]["p50_e2e_s"], "p99_e2e_s": s["stats"]["p99_e2e_s"],
         "flags": s["flags"]}
        for s in steps
    ]  # fmt: skip
    ph["figures"]["peak_ok_rps"] = max((s["ok_rps"] for s in ph["steps"]), default=0.0)
    ph["figures"]["p99_jumps"] = sum(1 for s in steps if s["flags"])
    ph["slo"] = evaluate(ph["stats"], plan.slo)
    log(
        f"  ramp: {[s['concurrency'] for s in ph['steps']]}, peak {ph['figures']['peak_ok_rps']:.1f} ok/s"
    )
    return ph


async def _burst(target: EndpointTarget, plan: CertPlan, d: Path, iu: bool, peak: float,
                 log: Log) -> dict[str, Any]:  # fmt: skip
    from chaoslib_infer.load.ceiling import load_ceiling

    cfg = plan.phases["burst"]
    notes = []
    peak = max(peak, 0.5)
    base = max(cfg["base_fraction"] * peak, 0.5)
    rate = cfg["factor"] * peak
    ceiling = load_ceiling()
    if ceiling and rate > ceiling / 2:
        notes.append(f"burst rate capped at half the client ceiling ({ceiling / 2:.0f} req/s)")
        rate = ceiling / 2
    profile = [(cfg["pre_s"], base), (cfg["burst_s"], rate), (cfg["post_s"], base)]
    path = _records_file(d, "burst")
    spec = _base_spec(target, plan, iu, profile=profile, seed=3,
                      max_concurrency=int(cfg["max_concurrency"]))  # fmt: skip
    with RecordWriter(path) as w:
        summ = await run_load(spec, w)
    phases = summ["phases"]
    b0, b1 = phases[1]["start_at"], phases[1]["end_at"]
    ph = _phase("burst", "fault", "burst/records.jsonl", summ["started_at"], summ["ended_at"])
    ph["notes"] = notes
    recs = read_records(path)
    _common(ph, recs)
    pre = window_stats(recs, phases[0]["start_at"], b0)
    during = window_stats(recs, b0, b1)
    rec_s = None
    if pre["p99_e2e_s"] is not None:
        rec_s = recovery(recs, b1, pre, plan.recovery["window_s"], plan.recovery["settle_s"],
                         end=phases[2]["end_at"])  # fmt: skip
    shed = sum(
        v["count"] for k, v in during["errors_by_class"].items() if k in ("http_429", "http_5xx")
    )
    settle = max(plan.recovery["settle_s"], cfg["post_s"] / 3)
    held, rows, _ = _held(recs, phases[2]["end_at"] - settle, phases[2]["end_at"], plan.slo, False)
    ph["figures"].update(
        base_rps=base, burst_rps=rate, burst_s=cfg["burst_s"], shed_requests=shed,
        burst_error_rate=during["error_rate"], burst_p99_e2e_s=during["p99_e2e_s"],
        baseline_p99_e2e_s=pre["p99_e2e_s"], recovery_s=rec_s,
    )  # fmt: skip
    ph["slo"], ph["held"] = rows, held
    ph["markers"] = [(b0, "burst", "#d62728"), (b1, "burst end", "#2ca02c")]
    log(f"  burst: {rate:.1f} req/s for {cfg['burst_s']:g} s, shed {shed}, recovery {rec_s}")
    return ph


async def _soak(target: EndpointTarget, plan: CertPlan, d: Path, iu: bool, log: Log
                ) -> dict[str, Any]:  # fmt: skip
    from chaoslib_infer.load.soak import MIX_CLASSES, parse_mix, stream_report

    cfg = plan.phases["soak"]
    mix = parse_mix(cfg["mix"])
    total = sum(w for _, w in mix)
    folder = d / "soak"
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runs = []
    for k, (cls, weight) in enumerate(mix):
        words, max_tokens = MIX_CLASSES[cls]
        spec = _base_spec(
            target, plan, iu, rate_rps=cfg["rate_rps"] * weight / total,
            duration_s=cfg["duration_s"], prompt_words=words, seed=40 + k,
            max_tokens=max(1, int(max_tokens * cfg["max_tokens_scale"])), max_concurrency=1024,
        )  # fmt: skip
        runs.append((cls, spec, folder / f"{cls}.jsonl"))

    async def one(spec: LoadSpec, path: Path) -> dict[str, Any]:
        with RecordWriter(path) as w:
            return await run_load(spec, w)

    await asyncio.gather(*(one(spec, path) for _, spec, path in runs))
    recs: list[dict[str, Any]] = []
    classes = {}
    for cls, spec, path in runs:
        part = read_records(path)
        classes[cls] = {"requests": len(part), "prompt_words": spec.prompt_words,
                        "max_tokens": spec.max_tokens,
                        "ok": sum(1 for r in part if r.get("ok"))}  # fmt: skip
        recs.extend(part)
    recs.sort(key=lambda r: r["sent_at"])
    with RecordWriter(folder / "records.jsonl") as w:
        for r in recs:
            w.write(r)
    ph = _phase("soak", "steady", "soak/records.jsonl", t0, time.time())
    _common(ph, recs)
    rep = stream_report(folder / "records.jsonl")
    lag = rep.get("p99_send_lag_s")
    ph["figures"].update(send_lag_p99_s=lag, classes=classes)
    ph["classes"] = classes
    if lag is not None and lag > cfg["lag_p99_max_ms"] / 1000:
        ph["notes"].append(
            f"schedule lag P99 {lag * 1000:.1f} ms > {cfg['lag_p99_max_ms']:g} ms: the client "
            "could not keep the schedule; latencies may hide client-side queueing"
        )
    ph["slo"] = evaluate(ph["stats"], plan.slo)
    log(f"  soak: {len(recs)} requests over {cfg['duration_s']:g} s ({cfg['mix']})")
    return ph


def _retry_figures(ph: dict[str, Any], recs: list[dict[str, Any]], start: float | None = None,
                   end: float | None = None) -> None:  # fmt: skip
    sel = recs
    if start is not None:  # the logical requests whose first attempt was sent in the window
        ids = {
            r.get("request_id") for r in select(recs, start, end) if int(r.get("attempt") or 1) == 1
        }
        sel = [r for r in recs if r.get("request_id") in ids]
    rs = retry_stats(sel)
    ph["figures"].update(
        logical_requests=rs["logical_requests"], attempts=rs["attempts"], retries=rs["retries"],
        retried_requests=rs["retried_requests"],
        succeeded_after_retry=rs["succeeded_after_retry"],
        retry_amplification=(rs["attempts"] / rs["logical_requests"]) if rs["logical_requests"] else None,
        timed_out_attempts=sum(1 for r in sel if str(r.get("error_class") or "").startswith("timeout_")),
        possible_duplicates=possible_duplicates(sel),
    )  # fmt: skip


async def _jitter(target: EndpointTarget, plan: CertPlan, d: Path, iu: bool, log: Log
                  ) -> dict[str, Any]:  # fmt: skip
    cfg = plan.phases["jitter"]
    jit = JitterProxy(target.chat_url, cfg["delay_ms"] / 1000, cfg["jitter_ms"] / 1000,
                      cfg["distribution"], seed=5)  # fmt: skip
    total = cfg["pre_s"] + cfg["jitter_s"] + cfg["post_s"]
    tmo = cfg["attempt_timeout_s"]
    path = _records_file(d, "jitter")
    async with jit:
        spec = _base_spec(
            target, plan, iu, url=jit.url_for(target.chat_url), rate_rps=cfg["rate_rps"],
            duration_s=total, seed=5, headers={**target.headers(), "Host": jit.netloc},
            retry_attempts=int(cfg["retry_attempts"]), retry_backoff_s=cfg["backoff_s"],
            attempt_timeout_s=tmo, ttft_timeout_s=tmo, idle_timeout_s=tmo,
            retry_on=DEFAULT_RETRY_ON,
        )  # fmt: skip
        mono, wall = time.monotonic(), time.time()
        j0, j1 = mono + 0.02 + cfg["pre_s"], mono + 0.02 + cfg["pre_s"] + cfg["jitter_s"]
        jit.activate(j0, j1)
        u0, u1 = wall + (j0 - mono), wall + (j1 - mono)
        with RecordWriter(path) as w:
            summ = await run_load(spec, w)
    ph = _phase("jitter", "fault", "jitter/records.jsonl", summ["started_at"], summ["ended_at"])
    recs = read_records(path)
    _common(ph, recs)
    _retry_figures(ph, recs, u0, u1)
    pre = window_stats(recs, summ["started_at"], u0)
    during = window_stats(recs, u0, u1)
    lg = logical_stats(recs, u0, u1)
    rec_s = None
    end = summ["started_at"] + total
    if pre["p99_e2e_s"] is not None:
        rec_s = recovery(
            recs, u1, pre, plan.recovery["window_s"], plan.recovery["settle_s"], end=end
        )
    settle = max(plan.recovery["settle_s"], cfg["post_s"] / 3)
    held, rows, _ = _held(recs, end - settle, end, plan.slo, True)
    ph["figures"].update(
        jitter_p99_e2e_s=during["p99_e2e_s"], baseline_p99_e2e_s=pre["p99_e2e_s"],
        jitter_logical_availability=lg["availability"], recovery_s=rec_s,
    )  # fmt: skip
    ph["ground_truth"] = {**jit.stats(), "window": [u0, u1]}
    ph["slo"], ph["held"] = rows, held
    ph["markers"] = [(u0, "jitter on", "#d62728"), (u1, "jitter off", "#2ca02c")]
    log(
        f"  jitter: {cfg['delay_ms']:g}+-{cfg['jitter_ms']:g} ms for {cfg['jitter_s']:g} s, "
        f"retries {ph['figures']['retries']}, possible duplicates {ph['figures']['possible_duplicates']}"
    )
    return ph


async def _timeouts(target: EndpointTarget, plan: CertPlan, d: Path, iu: bool, log: Log
                    ) -> dict[str, Any]:  # fmt: skip
    cfg = plan.phases["timeouts"]
    tmo = cfg["attempt_timeout_s"]
    spec = _base_spec(
        target, plan, iu, rate_rps=cfg["rate_rps"], duration_s=cfg["duration_s"], seed=6,
        retry_attempts=int(cfg["retry_attempts"]), retry_backoff_s=cfg["backoff_s"],
        attempt_timeout_s=tmo, ttft_timeout_s=tmo, idle_timeout_s=tmo, retry_on=DEFAULT_RETRY_ON,
    )  # fmt: skip
    path = _records_file(d, "timeouts")
    with RecordWriter(path) as w:
        summ = await run_load(spec, w)
    ph = _phase("timeouts", "fault", "timeouts/records.jsonl", summ["started_at"], summ["ended_at"])
    recs = read_records(path)
    _common(ph, recs)
    _retry_figures(ph, recs)
    held, rows, lg = _held(recs, summ["started_at"], summ["ended_at"] + 1e-6, plan.slo, True)
    ph["figures"].update(attempt_timeout_s=tmo, logical_availability=lg["availability"],
                         logical_p99_e2e_s=lg["p99_e2e_s"])  # fmt: skip
    ph["slo"], ph["held"] = rows, held
    log(
        f"  timeouts: {tmo:g} s per attempt, {ph['figures']['timed_out_attempts']} timed out, "
        f"retries {ph['figures']['retries']}, logical availability {lg['availability']}"
    )
    return ph


async def run_phases(target: EndpointTarget, plan: CertPlan, out: Path, include_usage: bool,
                     log: Log, phases: list[dict[str, Any]] | None = None
                     ) -> list[dict[str, Any]]:  # fmt: skip
    """Run every enabled phase of ``plan`` against ``target`` in order.

    Args:
        target: the target.
        plan: the plan.
        out: the target's evidence folder (``<out>/<phase>/records.jsonl``).
        include_usage: send ``stream_options.include_usage`` (from the conformance probe).
        log: progress line sink.
        phases: list each finished phase is appended to as it ends (so an interrupted run
            keeps the phases it finished); default a new list.

    Returns:
        One dict per phase that ran: ``name, kind ("steady"|"fault"), records (relative path),
        started_at, ended_at (unix s), stats (window_stats), figures, slo (rows), held (the
        post-fault hypothesis for fault phases, None for steady ones), markers, notes`` and
        per phase extras (``steps`` for the ramp, ``classes`` for the soak, ``ground_truth``
        for the jitter).

    Raises:
        OSError: a records file cannot be written.
    """
    phases = [] if phases is None else phases
    iu = include_usage
    if plan.enabled("single"):
        phases.append(await _single(target, plan, out, iu, log))
    peak = 0.0
    if plan.enabled("ramp"):
        phases.append(await _ramp(target, plan, out, iu, log))
        peak = phases[-1]["figures"]["peak_ok_rps"]
    if plan.enabled("burst"):
        if not peak:
            peak = plan.phases["soak"]["rate_rps"]
        phases.append(await _burst(target, plan, out, iu, peak, log))
    if plan.enabled("soak"):
        phases.append(await _soak(target, plan, out, iu, log))
    if plan.enabled("jitter"):
        phases.append(await _jitter(target, plan, out, iu, log))
    if plan.enabled("timeouts"):
        phases.append(await _timeouts(target, plan, out, iu, log))
    return phases
