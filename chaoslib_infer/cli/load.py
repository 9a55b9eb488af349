"""``chaos-infer load`` commands: ``three-phase``, ``soak``, ``ceiling``.

The target is ``--target URL`` (default the lab's HAProxy front at ``http://127.0.0.1:8800``),
``--target TARGET.yaml`` (a Kubernetes target file: traffic goes to its ``url``, which must match the
operator's URL allowlist like any target: ``CHAOS_INFER_ALLOW``, loopback by default; a target file
never allows itself) or ``--lab-dir DIR`` (a running lab: its front
URL, and every replica's ``/metrics`` is scraped). ``--workers N`` splits a three-phase or soak run
over N workers (:mod:`chaoslib_infer.load.workers`): local processes with ``--local``, else a Kubernetes Indexed Job in
``--namespace`` on the target file's cluster, one merged result either way.
Exit status: 0 done (and, with ``--strict``, every check passed and nothing flagged / the soak is
valid), 1 a check failed or the soak is invalid under ``--strict``, 2 bad input or refused by the
client-ceiling rule.
Beside each records file a run leaves in ``--out`` (the soak's ``records.jsonl``, each
three-phase step's ``<step>.jsonl``) go Locust-format CSV stats (:mod:`chaoslib_infer.load.locuststats`:
``records_stats.csv``, ``..._stats_history.csv``, ``..._failures.csv``), as the drills write them;
a three-phase run with ``--workers`` keeps its records per worker and writes none.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from .common import packed_options
from .usage import OneLineGroup

__all__ = ["load_group"]

_DEFAULT_URL = "http://127.0.0.1:8800"


def _fail(msg: str, code: int = 2) -> None:
    click.echo(f"chaos-infer: error: {msg}", err=True)
    sys.exit(code)


def _allowed(url: str) -> None:
    """Refuse a target outside the allowlist (loopback by default; ``CHAOS_INFER_ALLOW`` widens
    it) with one line and exit 2, before any request or name lookup."""
    from chaoslib_infer.errors import InferChaosError
    from chaoslib_infer.safety.allowlist import check_target

    try:
        check_target(url)
    except InferChaosError as exc:
        _fail(str(exc))


def _k8s_target(target: str | None) -> Any:
    """The Kubernetes target named by ``--target FILE.yaml``, or None.

    Its context and namespace are checked against the operator's allowlist (the file only
    narrows it), and so is its ``url``, where the load goes: against the operator's URL patterns
    (``CHAOS_INFER_ALLOW``; loopback by default), as the game day does. A refusal is one line and
    exit 2, before any API call or request.
    """
    if not target or "://" in target or not target.lower().endswith((".yaml", ".yml")):
        return None
    from chaoslib_infer.errors import InferChaosError
    from chaoslib_infer.platforms.kubernetes.target import load_target
    from chaoslib_infer.safety.allowlist import check_target

    try:
        k8s = load_target(target)
        check_target(k8s.url, what=f"{k8s.source}: url")
    except InferChaosError as exc:
        _fail(str(exc))
    return k8s


def _resolve(target: str | None, lab_dir: Path | None) -> tuple[str, list[str]]:
    k8s = _k8s_target(target)
    if k8s is not None:
        return k8s.url, [k8s.url.rstrip("/").removesuffix("/v1") + "/metrics"]
    if target:
        _allowed(target)
    if lab_dir is None:
        url = target or _DEFAULT_URL
        return url, [url.rstrip("/").removesuffix("/v1") + "/metrics"]
    from chaoslib_infer.lab.fleet import Lab

    lab = Lab.attach(lab_dir)
    murls = []
    for rep in lab.meta.get("replicas", []):
        port = rep.get("port")
        if port and not rep.get("standby"):
            murls.append(f"http://{lab.replica_host(rep['name'])}:{port}/metrics")
    return target or lab.url, murls or [lab.url + "/metrics"]


def _out_ok(out: Path) -> None:
    """Refuse (one line, exit 2) an ``--out`` that is a file or cannot be made, before any load."""
    from chaoslib_infer.errors import ConfigError
    from chaoslib_infer.evidence.outdir import prepare_out_dir

    try:
        prepare_out_dir(out)
    except ConfigError as exc:
        _fail(str(exc))


def _locust_csv(out: Path, report: Mapping[str, Any]) -> None:
    """Write Locust-format CSV stats (:func:`.locuststats.write_locust_stats`) beside each records
    file the run left: each step's ``records`` of a three-phase report, and ``out/records.jsonl``
    (a soak's). A file that cannot be read or written is a warning on stderr, never a failure."""
    from chaoslib_infer.load.locuststats import write_locust_stats

    paths = [Path(str(s["records"])) for s in report.get("steps") or [] if s.get("records")]
    paths.append(out / "records.jsonl")
    for path in dict.fromkeys(paths):
        if not path.is_file():
            continue
        try:
            write_locust_stats(path)
        except (OSError, ValueError) as exc:
            click.echo(f"chaos-infer: warning: no Locust CSV stats for {path}: {exc}", err=True)


def _ceiling(value: float | None) -> float | None:
    if value is not None:
        return value if value > 0 else None
    from chaoslib_infer.load.ceiling import load_ceiling

    return load_ceiling()


@dataclass(frozen=True)
class _RunOptions:
    """The target and output options both measurement runs take (``opts``)."""

    target: str | None
    lab_dir: Path | None
    out: Path
    model: str
    timeout_s: float
    client_ceiling: float | None
    strict: bool


_target_opts = packed_options(_RunOptions, "opts", [
    click.option(
        "--strict", is_flag=True, help="exit 1 when a check fails or a flag is raised"
    ),
    click.option(
        "--client-ceiling", type=float, default=None,
        help="client ceiling req/s (default: saved by `load ceiling --save`; 0 disables the rule)",
    ),
    click.option("--timeout-s", type=float, default=60.0, show_default=True),
    click.option("--model", default="chaos-sim", show_default=True),
    click.option(
        "--out", type=click.Path(path_type=Path), required=True, help="output directory"
    ),
    click.option(
        "--lab-dir", type=click.Path(path_type=Path), default=None, help="lab state dir"
    ),
    click.option("--target", default=None, help=f"base URL (default {_DEFAULT_URL})"),
])  # fmt: skip


@dataclass(frozen=True)
class _WorkerOptions:
    """How a run is split over workers (``fleet``; :mod:`chaoslib_infer.load.workers`)."""

    workers: int
    local: bool
    image: str | None
    namespace: str


_workers_opts = packed_options(_WorkerOptions, "fleet", [
    click.option(
        "--namespace", default="chaos-infer", show_default=True, help="namespace of the Job"
    ),
    click.option(
        "--image", default=None, help="worker image (default chaoslib-infer:VERSION; Dockerfile)"
    ),
    click.option("--local", is_flag=True, help="with --workers: processes on this machine"),
    click.option(
        "--workers", type=click.IntRange(1, 256), default=1, show_default=True,
        help="split the run over N workers (a Kubernetes Indexed Job; --local: processes here)",
    ),
])  # fmt: skip


def _run_workers(
    mode: str, target: str | None, fleet: _WorkerOptions, params: dict[str, Any], out: Path
) -> dict[str, Any]:
    """Run ``mode`` over ``fleet.workers`` workers (see :mod:`chaoslib_infer.load.workers`); exit
    2 with one line on error."""
    workers, local, image, namespace = fleet.workers, fleet.local, fleet.image, fleet.namespace
    from chaoslib_infer import __version__
    from chaoslib_infer.errors import InferChaosError
    from chaoslib_infer.load.workers import run_local
    from chaoslib_infer.platforms.kubernetes.load_job import run_k8s

    def log(m: str) -> None:
        click.echo(m, err=True)

    try:
        if local:
            return run_local(mode, params, workers, out, log)
        k8s = _k8s_target(target)
        if k8s is None:
            raise ValueError(
                f"--workers {workers} runs a Kubernetes Job: give --target TARGET.yaml "
                "(the cluster), or --local for processes on this machine"
            )
        img = image or f"chaoslib-infer:{__version__}"
        return run_k8s(k8s, mode, params, workers, out, img, namespace, log)
    except (InferChaosError, RuntimeError, ValueError, OSError) as exc:
        _fail(str(exc))
        raise  # unreachable: _fail exits


def _trace_opts(f: Any) -> Any:
    f = click.option(
        "--trace", default=None, metavar="FILE",
        help="replay a recorded trace (Mooncake/AIPerf JSONL: timestamp ms, input_length, "
        "output_length, hash_ids)",
    )(f)  # fmt: skip
    f = click.option(
        "--trace-speed", type=float, default=1.0, show_default=True,
        help="trace time scale (2 = twice as fast)",
    )(f)  # fmt: skip
    return f


def _check_trace(trace: str | None, speed: float, workers: int) -> None:
    """Refuse (one line, exit 2) an unreadable or invalid trace, before any load."""
    if trace is None:
        return
    from chaoslib_infer.load.trace import read_trace, trace_offsets

    if workers > 1:
        _fail("--trace runs in one process: drop --workers")
    try:
        trace_offsets(read_trace(trace), speed)
    except ValueError as exc:
        _fail(str(exc))


@click.group("load", cls=OneLineGroup)
def load_group() -> None:
    """Measurement runs: three-phase load test, realistic soak, client ceiling."""


@load_group.command("three-phase")
@_target_opts
@click.option("--single-n", type=int, default=1000, show_default=True)
@click.option("--ramp", default="50,200,500", show_default=True, help="closed-loop concurrencies")
@click.option("--step-s", type=float, default=30.0, show_default=True)
@click.option("--burst-rps", type=float, default=None, help="default 2x the ramp's peak ok/s")
@click.option("--burst-s", type=float, default=30.0, show_default=True)
@click.option("--max-tokens", type=int, default=32, show_default=True)
@click.option("--shards", type=int, default=1, show_default=True, help="processes for the burst")
@click.option("--scrape-interval-s", type=float, default=0.5, show_default=True)
@_trace_opts
@_workers_opts
def three_phase(
    opts: _RunOptions,
    single_n: int,
    ramp: str,
    step_s: float,
    burst_rps: float | None,
    burst_s: float,
    max_tokens: int,
    shards: int,
    scrape_interval_s: float,
    trace: str | None,
    trace_speed: float,
    fleet: _WorkerOptions,
) -> None:
    """Single stream, concurrency ramp, burst; prints the acceptance table per step.

    With --trace FILE the burst phase replays a recorded trace (Mooncake / AIPerf JSONL:
    arrival times and request sizes, time-scaled by --trace-speed) instead of Poisson arrivals.

    With --workers N the ramp's concurrencies and the burst rate are split over N workers
    (the single stream stays one stream, on one worker, first) and their HDR histograms merged.
    """
    from chaoslib_infer.load.ceiling import CeilingRefused
    from chaoslib_infer.load.phases import ThreePhaseSpec, render_table, run_three_phase

    try:
        steps = tuple(int(x) for x in ramp.split(",") if x.strip())
    except ValueError:
        _fail(f"--ramp must be comma-separated integers, got {ramp!r}")
    url, murls = _resolve(opts.target, opts.lab_dir)
    _check_trace(trace, trace_speed, fleet.workers)
    _out_ok(opts.out)
    if fleet.workers > 1:
        if any(c < fleet.workers for c in steps):
            _fail(
                f"--ramp {ramp}: with --workers {fleet.workers} every step needs >= {fleet.workers}"
            )
        if fleet.local and burst_rps is not None:
            from chaoslib_infer.load.ceiling import check_rate

            try:
                check_rate(burst_rps, _ceiling(opts.client_ceiling), fleet.workers, "burst")
            except CeilingRefused as exc:
                _fail(str(exc).replace("--shards", "--workers"))
        params = {
            "url": url, "model": opts.model, "timeout_s": opts.timeout_s, "single_n": single_n,
            "ramp": ",".join(map(str, steps)), "step_s": step_s, "burst_rps": burst_rps,
            "burst_s": burst_s, "max_tokens": max_tokens,
        }  # fmt: skip
        merged = _run_workers("three-phase", opts.target, fleet, params, opts.out)
        _locust_csv(opts.out, merged)
        click.echo(render_table(merged))
        click.echo(f"report: {opts.out / 'report.json'}")
        if opts.strict and (not merged["passed"] or merged["flagged"]):
            sys.exit(1)
        return
    spec = ThreePhaseSpec(
        url=url, single_n=single_n, ramp=steps, step_s=step_s, burst_rps=burst_rps,
        burst_s=burst_s, max_tokens=max_tokens, model=opts.model, timeout_s=opts.timeout_s,
        metrics_urls=murls, scrape_interval_s=scrape_interval_s,
        ceiling_rps=_ceiling(opts.client_ceiling), shards=shards, trace=trace,
        trace_speed=trace_speed,
    )  # fmt: skip
    try:
        report = run_three_phase(spec, opts.out, lambda m: click.echo(m, err=True))
    except (CeilingRefused, ValueError) as exc:
        _fail(str(exc))
    _locust_csv(opts.out, report)
    click.echo(render_table(report))
    click.echo(f"report: {opts.out / 'report.json'}")
    if opts.strict and (not report["passed"] or report["flagged"]):
        sys.exit(1)


@load_group.command("soak")
@_target_opts
@click.option("--duration", default="30m", show_default=True, help="e.g. 30m, 90s, 1h")
@click.option("--rate", type=float, default=None, help="peak mean rate, req/s (or --trace)")
@click.option("--mix", default="short:70,mid:25,long:5", show_default=True)
@click.option("--burstiness", default="poisson", show_default=True, help="poisson or gamma:K")
@click.option("--headroom", type=float, default=1.0, show_default=True, help="rate multiplier")
@click.option("--lag-p99-max-ms", type=float, default=50.0, show_default=True)
@click.option("--max-concurrency", type=int, default=1024, show_default=True)
@click.option("--max-tokens-scale", type=float, default=1.0, show_default=True)
@_trace_opts
@_workers_opts
def soak(
    opts: _RunOptions,
    duration: str,
    rate: float,
    mix: str,
    burstiness: str,
    headroom: float,
    lag_p99_max_ms: float,
    max_concurrency: int,
    max_tokens_scale: float,
    trace: str | None,
    trace_speed: float,
    fleet: _WorkerOptions,
) -> None:
    """Random arrivals and a prompt-length mixture; invalid when the schedule lag P99 is too high.

    With --workers N each worker runs 1/N of the rate and concurrency with its own seed; the
    result merges their HDR histograms (invalid when any worker could not keep its schedule).

    With --trace FILE the arrivals and request sizes are a recorded trace's (Mooncake / AIPerf
    JSONL, time-scaled by --trace-speed; --rate, --duration, --mix and --burstiness unused),
    judged by the same schedule-lag rule.
    """
    if trace is not None:
        _check_trace(trace, trace_speed, fleet.workers)
        from chaoslib_infer.load.ceiling import CeilingRefused as _Refused
        from chaoslib_infer.load.soak import run_trace_soak

        url = _resolve(opts.target, opts.lab_dir)[0]
        _out_ok(opts.out)
        try:
            report = run_trace_soak(
                url, trace, opts.out, trace_speed, lag_p99_max_ms / 1000, max_concurrency,
                opts.model, opts.timeout_s, _ceiling(opts.client_ceiling),
            )  # fmt: skip
        except (_Refused, ValueError) as exc:
            _fail(str(exc))
        _soak_result(report, url, opts.strict, opts.out)
        return
    if rate is None:
        _fail("--rate is required (or --trace FILE)")
        return
    from chaoslib_infer.load.ceiling import CeilingRefused
    from chaoslib_infer.load.soak import SoakSpec, parse_burstiness, parse_mix, run_soak

    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    try:
        dur = (
            float(duration[:-1]) * units[duration[-1]] if duration[-1] in units else float(duration)
        )
        spec = SoakSpec(
            url=_resolve(opts.target, opts.lab_dir)[0], duration_s=dur, rate_rps=rate,
            mix=parse_mix(mix),
            gamma_shape=parse_burstiness(burstiness), headroom=headroom,
            max_concurrency=max_concurrency, lag_p99_max_s=lag_p99_max_ms / 1000, model=opts.model,
            timeout_s=opts.timeout_s, ceiling_rps=_ceiling(opts.client_ceiling),
            max_tokens_scale=max_tokens_scale,
        )  # fmt: skip
        if not (dur > 0 and rate > 0 and headroom > 0):
            raise ValueError("--duration, --rate and --headroom must be > 0")
        _out_ok(opts.out)
        if fleet.workers > 1:
            if fleet.local:
                from chaoslib_infer.load.ceiling import check_rate

                check_rate(spec.effective_rate, spec.ceiling_rps, fleet.workers, "soak")
            params = {
                "url": spec.url, "model": opts.model, "timeout_s": opts.timeout_s,
                "duration_s": dur,
                "rate": rate, "mix": mix, "burstiness": burstiness, "headroom": headroom,
                "lag_p99_max_ms": lag_p99_max_ms, "max_concurrency": max_concurrency,
                "max_tokens_scale": max_tokens_scale,
            }  # fmt: skip
            report = _run_workers("soak", opts.target, fleet, params, opts.out)
        else:
            report = run_soak(spec, opts.out, lambda m: click.echo(m, err=True))
    except (CeilingRefused, ValueError, IndexError) as exc:
        _fail(str(exc))
    _soak_result(report, spec.url, opts.strict, opts.out)


def _soak_result(report: dict[str, Any], url: str, strict: bool, out: Path) -> None:
    """Write the soak's Locust CSV, print its report and exit 1 when nothing succeeded (or
    invalid under --strict)."""
    _locust_csv(out, report)
    if report["valid"]:
        click.echo(json.dumps(report["stats"], indent=1))
    else:
        click.echo(f"INVALID: {report['invalid_reason']}")
    click.echo(f"report: {out / 'report.json'}")
    stats = report.get("stats") or {}
    if stats.get("requests") and not stats.get("ok"):
        errors = ", ".join(
            f"{cls} {e['count']} ({e.get('sample', '')})"
            for cls, e in (stats.get("errors_by_class") or {}).items()
        )
        click.echo(
            f"FAILED: no request to {url} succeeded ({stats['requests']} sent; {errors})",
            err=True,
        )
        sys.exit(1)
    if strict and not report["valid"]:
        sys.exit(1)


@load_group.command("ceiling")
@click.option("--target", default=None, help="zero-latency engine URL (default: start one)")
@click.option("--duration-s", type=float, default=5.0, show_default=True)
@click.option("--concurrency", type=int, default=32, show_default=True)
@click.option("--max-tokens", type=int, default=16, show_default=True)
@click.option("--save", is_flag=True, help="save as the ceiling the refusal rule uses")
def ceiling(
    target: str | None, duration_s: float, concurrency: int, max_tokens: int, save: bool
) -> None:
    """Highest streamed request rate this client sustains against a zero-latency lab engine."""
    from chaoslib_infer.load.ceiling import CEILING_FILE, measure_ceiling, sim_engine

    if target:
        _allowed(target)
        res = measure_ceiling(target, duration_s, concurrency, max_tokens)
    else:
        with sim_engine(output_tokens=max_tokens) as url:
            res = measure_ceiling(url, duration_s, concurrency, max_tokens)
    click.echo(json.dumps(res))
    if save:
        CEILING_FILE.parent.mkdir(parents=True, exist_ok=True)
        CEILING_FILE.write_text(json.dumps(res))
        click.echo(f"saved: {CEILING_FILE}", err=True)
