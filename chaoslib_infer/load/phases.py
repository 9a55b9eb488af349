"""Three-phase load test (``docs/definitions.md``): single stream, concurrency ramp, burst.

1. **single**: ``single_n`` sequential requests (concurrency 1), each prompt starting with a fresh
   random nonce (token 0), so no prefix or response cache can serve it: the service's unloaded
   latency.
2. **ramp**: closed-loop steps at each concurrency in ``ramp`` (e.g. 50, 200, 500) for ``step_s``
   seconds each: ``C`` workers, each sending its next request when the previous one ends.
3. **burst**: open loop (Poisson arrivals from an absolute schedule, ``client.run_load``) at
   ``burst_rps`` (default: 2x the peak successful rate of the ramp) for ``burst_s`` seconds;
   sharded across processes with ``shards`` > 1 (``shard.run_sharded``).

Each step's records go to ``<out>/<step>.jsonl``; server-side ``/metrics`` are scraped beside them
(``measure.scrape``, every ``scrape_interval_s`` <= 1 s) into ``<out>/server_metrics.jsonl``. The
report (``<out>/report.json``) has, per step, the acceptance table of ``measure.slo`` (the
references of ``docs/definitions.md``) with pass/fail, the window statistics (percentiles with the
censored fraction beside them), the server-side window summary (queue time vs engine TTFT), and a
``p99_jump`` flag when a step's P99 E2E is more than ``jump_factor`` (10) times the previous step's.

The client ceiling rule (``ceiling.check_rate``) refuses a burst that needs more than half the
client ceiling per process; a ramp step that reaches more than half of it is flagged
``client_bound``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib_infer.measure.metrics import window_stats
from chaoslib_infer.measure.scrape import MetricsScraper, read_samples, window_summary
from chaoslib_infer.measure.slo import Thresholds, evaluate

from .ceiling import check_rate
from .client import (
    LoadSpec,
    build_body,
    endpoint_url,
    make_session,
    new_loop,
    run_load,
    send_attempt,
)
from .records import RecordWriter, read_records

__all__ = ["ThreePhaseSpec", "flag_steps", "render_table", "run_three_phase"]


@dataclass
class ThreePhaseSpec:
    """Parameters of a three-phase run (times in seconds, rates in requests/s).

    Attributes:
        url: base URL of the target.
        single_n: sequential requests of phase 1.
        ramp: closed-loop concurrency steps of phase 2.
        step_s: duration of each ramp step.
        burst_rps: open-loop rate of phase 3 (None: 2x the ramp's peak ``ok_rps``).
        burst_s: duration of phase 3 (0 skips it).
        max_tokens, prompt_words, model, api, timeout_s: request shape and per-attempt timeout.
        metrics_urls: ``/metrics`` URLs to scrape (empty: ``<url>/metrics``).
        scrape_interval_s: scrape period (<= 1).
        thresholds: acceptance thresholds (default ``slo.Thresholds()``).
        jump_factor: P99 jump between consecutive steps that raises the flag.
        ceiling_rps: client ceiling for the refusal rule (None: not applied).
        shards: processes for the burst phase.
        headers: extra request headers.
        trace: a recorded trace (``trace.read_trace``) replayed as the burst phase instead of
            Poisson arrivals at ``burst_rps`` (its schedule and sizes; ``burst_rps``/``burst_s``
            unused). trace_speed: its time scale.
    """

    url: str
    single_n: int = 1000
    ramp: Sequence[int] = (50, 200, 500)
    step_s: float = 30.0
    burst_rps: float | None = None
    burst_s: float = 30.0
    max_tokens: int = 32
    prompt_words: int = 16
    model: str = "sim"
    api: str = "chat"
    timeout_s: float = 60.0
    metrics_urls: Sequence[str] = ()
    scrape_interval_s: float = 0.5
    thresholds: Thresholds = field(default_factory=Thresholds)
    jump_factor: float = 10.0
    ceiling_rps: float | None = None
    shards: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    trace: str | None = None
    trace_speed: float = 1.0

    def load_spec(self, **kw: Any) -> LoadSpec:
        """A ``LoadSpec`` with this run's request shape and timeouts."""
        base: dict[str, Any] = dict(
            url=self.url,
            api=self.api,
            model=self.model,
            max_tokens=self.max_tokens,
            prompt_words=self.prompt_words,
            timeout_s=self.timeout_s,
            ttft_timeout_s=self.timeout_s,
            idle_timeout_s=self.timeout_s,
            headers=dict(self.headers),
        )
        base.update(kw)
        return LoadSpec(**base)


async def _sequential(spec: LoadSpec, n: int, writer: RecordWriter) -> None:
    url = endpoint_url(spec)
    rng = random.Random(spec.seed)
    async with make_session(spec) as session:
        for i in range(n):
            body = json.dumps(build_body(spec, rng)).encode()  # fresh nonce at token 0
            writer.write(await send_attempt(session, spec, body, f"single-{i}", url=url))


async def _closed_loop(
    spec: LoadSpec, concurrency: int, duration_s: float, writer: RecordWriter
) -> None:
    url = endpoint_url(spec)
    rng = random.Random(spec.seed + concurrency)
    end = time.perf_counter() + duration_s
    async with make_session(spec) as session:

        async def worker(w: int) -> None:
            i = 0
            while time.perf_counter() < end:
                body = json.dumps(build_body(spec, rng)).encode()
                writer.write(
                    await send_attempt(session, spec, body, f"c{concurrency}-{w}-{i}", url=url)
                )
                i += 1

        await asyncio.gather(*(worker(w) for w in range(concurrency)))


def _step_report(
    name: str, kind: str, path: Path, start: float, end: float, spec: ThreePhaseSpec
) -> dict[str, Any]:
    recs = read_records(path)
    stats = window_stats(recs, start, end + spec.timeout_s + 5)
    stats["ok_rps"] = stats["ok"] / max(end - start, 1e-9)
    rows = evaluate(stats, spec.thresholds)
    return {
        "step": name,
        "kind": kind,
        "records": str(path),
        "start_at": start,
        "end_at": end,
        "stats": stats,
        "acceptance": rows,
        "passed": all(r["passed"] for r in rows),
        "flags": [],
    }


async def _run(spec: ThreePhaseSpec, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    base = spec.load_spec()
    murls = list(spec.metrics_urls) or [spec.url.rstrip("/").removesuffix("/v1") + "/metrics"]
    steps: list[dict[str, Any]] = []
    scrape_path = out / "server_metrics.jsonl"
    async with MetricsScraper(murls, scrape_path, spec.scrape_interval_s):
        if spec.single_n > 0:
            p = out / "single.jsonl"
            t0 = time.time()
            with RecordWriter(p) as w:
                await _sequential(base, spec.single_n, w)
            steps.append(_step_report("single", "single", p, t0, time.time(), spec))
            log(f"single: {spec.single_n} sequential requests done")
        for c in spec.ramp:
            p = out / f"ramp-{c}.jsonl"
            t0 = time.time()
            with RecordWriter(p) as w:
                await _closed_loop(spec.load_spec(max_concurrency=max(c, 1)), c, spec.step_s, w)
            steps.append(_step_report(f"ramp-{c}", "ramp", p, t0, time.time(), spec))
            log(f"ramp-{c}: {steps[-1]['stats']['requests']} requests")
        if spec.burst_s > 0 or spec.trace is not None:
            peak = max((s["stats"]["ok_rps"] for s in steps if s["kind"] == "ramp"), default=0.0)
            rate = spec.burst_rps if spec.burst_rps is not None else 2.0 * peak
            tspec = None
            if spec.trace is not None:  # the trace is the burst: its schedule, sizes and rate
                tspec = spec.load_spec(
                    trace=spec.trace, trace_speed=spec.trace_speed,
                    max_concurrency=4 * max(spec.ramp, default=64),
                )  # fmt: skip
                rate = tspec.rate_rps
            if rate <= 0:
                raise ValueError("burst rate unknown: give --burst-rps or a ramp")
            check_rate(rate, spec.ceiling_rps, spec.shards, "burst")
            peak_c = max(spec.ramp, default=64)
            t0 = time.time()
            if tspec is not None:
                p = out / "burst.jsonl"
                with RecordWriter(p) as w:
                    await run_load(tspec, w)
            elif spec.shards > 1:
                from .shard import run_sharded

                res = await asyncio.to_thread(
                    run_sharded, spec.url, rate, spec.burst_s, spec.shards, out / "burst-shards",
                    max_concurrency=4 * peak_c, max_tokens=spec.max_tokens, timeout_s=spec.timeout_s,
                )  # fmt: skip
                p = Path(res["merged"])
            else:
                p = out / "burst.jsonl"
                lspec = spec.load_spec(
                    rate_rps=rate, duration_s=spec.burst_s, max_concurrency=4 * peak_c
                )
                with RecordWriter(p) as w:
                    await run_load(lspec, w)
            steps.append(_step_report("burst", "burst", p, t0, time.time(), spec))
            steps[-1]["rate_rps"] = rate
            if tspec is not None:
                steps[-1]["trace"] = {"path": spec.trace, "speed": spec.trace_speed}
                log(f"burst: trace {spec.trace} ({tspec.rate_rps:.1f} req/s mean)")
            else:
                log(f"burst: {rate:.1f} req/s for {spec.burst_s:g} s")
    samples = read_samples(scrape_path)
    for s in steps:
        s["server"] = window_summary(samples, s["start_at"], s["end_at"])
    flag_steps(steps, spec.jump_factor, spec.ceiling_rps)
    return {
        "url": spec.url,
        "steps": steps,
        "server_metrics": str(scrape_path),
        "passed": all(s["passed"] for s in steps),
        "flagged": any(s["flags"] for s in steps),
    }


def flag_steps(
    steps: list[dict[str, Any]], jump_factor: float = 10.0, ceiling_rps: float | None = None
) -> None:
    """Append flags to each step in place: ``p99_jump`` when its P99 E2E exceeds ``jump_factor``
    times the previous step's (the last step with a P99), ``client_bound`` when a ramp step's
    ``ok_rps`` exceeds half the client ceiling."""
    prev_p99: float | None = None
    for s in steps:
        p99 = s["stats"].get("p99_e2e_s")
        if prev_p99 and p99 and p99 > jump_factor * prev_p99:
            s["flags"].append(f"p99_jump: {p99:.3f}s > {jump_factor:g}x previous {prev_p99:.3f}s")
        prev_p99 = p99 or prev_p99
        if ceiling_rps and s["kind"] == "ramp" and s["stats"]["ok_rps"] > ceiling_rps / 2:
            s["flags"].append("client_bound: over half the client ceiling")


def run_three_phase(
    spec: ThreePhaseSpec, out: Path, log: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    """Run the three phases and write ``<out>/report.json``.

    Args:
        spec: the run's parameters.
        out: output directory (created).
        log: progress line sink.

    Returns:
        The report: ``url, steps`` (see module docstring), ``server_metrics`` (path), ``passed``
        (every acceptance row of every step passed), ``flagged`` (a step carries a flag).

    Raises:
        ceiling.CeilingRefused: the burst needs more than half the client ceiling per process.
        ValueError: no burst rate can be derived.
        OSError: the output directory is not writable.
    """
    out.mkdir(parents=True, exist_ok=True)
    with asyncio.Runner(loop_factory=new_loop) as runner:
        report = runner.run(_run(spec, out, log))
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def _fmt(v: Any, ms: bool = False) -> str:
    if v is None:
        return "-"
    if ms:
        return f"{v * 1000:.1f}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render_table(report: dict[str, Any]) -> str:
    """The acceptance table, one row per step (latencies in ms), then failing checks and flags."""
    head = (
        f"{'step':<10} {'req':>6} {'ok/s':>8} {'p50ms':>8} {'p95ms':>8} {'p99ms':>9} "
        f"{'ttft99':>8} {'err%':>6} {'tmo%':>6} {'avail':>7} {'cens':>6} {'srvTTFT':>8} "
        f"{'srvQ':>7} {'verdict':>7}"
    )
    lines = [head]
    for s in report["steps"]:
        st, sv = s["stats"], s.get("server", {})
        er = st.get("error_rate")
        tr = st.get("timeout_rate")
        lines.append(
            f"{s['step']:<10} {st['requests']:>6} {st['ok_rps']:>8.1f} "
            f"{_fmt(st.get('p50_e2e_s'), True):>8} {_fmt(st.get('p95_e2e_s'), True):>8} "
            f"{_fmt(st.get('p99_e2e_s'), True):>9} {_fmt(st.get('p99_ttft_s'), True):>8} "
            f"{_fmt(None if er is None else er * 100):>6} {_fmt(None if tr is None else tr * 100):>6} "
            f"{_fmt(st.get('availability')):>7} {_fmt(st.get('censored_fraction')):>6} "
            f"{_fmt(sv.get('mean_ttft_s'), True):>8} {_fmt(sv.get('mean_queue_time_s'), True):>7} "
            f"{'PASS' if s['passed'] else 'FAIL':>7}"
        )
    for s in report["steps"]:
        for r in s["acceptance"]:
            if not r["passed"]:
                lines.append(
                    f"  {s['step']}: {r['metric']} = {_fmt(r['value'])} not {r['op']} {_fmt(r['threshold'])}"
                )
        for f in s["flags"]:
            lines.append(f"  {s['step']}: FLAG {f}")
    return "\n".join(lines)
