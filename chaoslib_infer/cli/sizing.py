"""``chaos-infer capacity`` and ``chaos-infer alerts``: instance count and alert rules."""

from __future__ import annotations

from pathlib import Path

import click

from .common import fail
from .usage import OneLineCommand

__all__ = ["alerts", "capacity"]


@click.command(cls=OneLineCommand)
@click.option(
    "--peak-qps", type=float, required=True, help="Peak requests/s of the busiest 10 minutes."
)
@click.option("--latency-s", type=float, required=True, help="Expected latency per request (s).")
@click.option(
    "--concurrency", type=float, required=True, help="Max concurrent requests one instance serves."
)
@click.option(
    "--redundancy",
    type=float,
    default=0.7,
    show_default=True,
    help="Redundancy factor (target utilisation, 0..1).",
)
def capacity(peak_qps: float, latency_s: float, concurrency: float, redundancy: float) -> None:
    """Instances needed: ceil(peak_QPS x latency_s / concurrency / redundancy).

    Worked example (docs/definitions.md): 200 QPS x 1 s / 20 / 0.7 = 14.28, so 15 instances.
    """
    from chaoslib_infer.capacity import plan

    try:
        cap = plan(peak_qps, latency_s, concurrency, redundancy)
    except ValueError as exc:
        fail(f"capacity: {exc}")
        return
    click.echo(cap.describe())
    click.echo(
        f"autoscaler minimum ~60%: {cap.autoscaler_min}; acceptance load 1.5x peak: {cap.acceptance_qps:g} QPS"
    )
    click.echo(str(cap.instances))


@click.command(cls=OneLineCommand)
@click.option(
    "--target-p99",
    "target_p99_s",
    type=float,
    default=10.0,
    show_default=True,
    metavar="S",
    help="P99 latency target (s); the alert fires at 1.5x it for 5 min.",
)
@click.option(
    "--target-mean",
    "target_mean_s",
    type=float,
    default=2.0,
    show_default=True,
    metavar="S",
    help="Mean response time target (s); the alert fires above it for 10 min.",
)
@click.option(
    "--servable-concurrency",
    type=float,
    default=20.0,
    show_default=True,
    help="Requests one instance serves at once (vLLM --max-num-seqs): queue-depth threshold.",
)
@click.option(
    "--selector",
    default="",
    metavar="MATCHERS",
    help='Extra label matchers for the inference metrics, e.g. \'namespace="llm",job="vllm"\'.',
)
@click.option(
    "--rate-window",
    default="2m",
    show_default=True,
    help="Window of every rate(); at least two scrape intervals.",
)
@click.option("--namespace", default=None, help="Namespace of the PrometheusRule object.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("alerts"),
    show_default=True,
    help="Folder for alert-rules.yaml (plain) and prometheusrule.yaml (Prometheus Operator).",
)
def alerts(
    target_p99_s: float,
    target_mean_s: float,
    servable_concurrency: float,
    selector: str,
    rate_window: str,
    namespace: str | None,
    out_dir: Path,
) -> None:
    """Write the alert table of docs/definitions.md as Prometheus rules (vLLM, DCGM,
    node_exporter and kube-state-metrics names); check them with `promtool check rules`."""
    from chaoslib_infer.prometheus import AlertConfig, alert_specs, write_alerts

    cfg = AlertConfig(
        target_p99_s=target_p99_s,
        target_mean_s=target_mean_s,
        servable_concurrency=servable_concurrency,
        selector=selector,
        rate_window=rate_window,
        namespace=namespace,
    )
    try:
        specs = alert_specs(cfg)
        plain, operator_rule = write_alerts(out_dir, cfg)
    except (ValueError, OSError) as exc:
        fail(f"alerts: {exc}")
        return
    for s in specs:
        click.echo(f"{s.alert:28} {s.layer:10} {s.signal} {s.op} {s.threshold:g} for {s.for_}")
    click.echo(f"wrote {plain} and {operator_rule}")
