"""Monitoring that comes first: PromQL for the alerted signals, and the alert table as rules.

Every query here is built by one function, so the alert rules (``chaos-infer alerts``) and the
PromQL probes (:mod:`chaoslib_infer.activities.prometheus`, :mod:`chaoslib_infer.activities.gpu`)
watch exactly the same expressions.

Metric names (from the exporters' own documentation):

- vLLM's ``/metrics``: ``vllm:e2e_request_latency_seconds`` (histogram: ``_bucket``/``_sum``/
  ``_count``), ``vllm:num_requests_waiting`` and ``vllm:num_requests_running`` (gauges); its HTTP
  server is instrumented by prometheus-fastapi-instrumentator: ``http_requests_total{handler,
  method, status}`` with the status grouped as ``2xx``/``4xx``/``5xx``.
- NVIDIA DCGM exporter: ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (frame buffer MiB),
  ``DCGM_FI_DEV_GPU_UTIL`` (percent, 0-100).
- node_exporter: ``node_cpu_seconds_total{mode="idle"}``.
- kube-state-metrics: ``kube_pod_container_status_restarts_total``.

The alert table (``docs/definitions.md``, "Alert table"):

=========== ========================== ==================================
layer       signal                     alert when
=========== ========================== ==================================
business    error rate (5xx)           > 0.5% for 3 min
business    P99 latency                > 1.5x target for 5 min
business    mean response time         > target for 10 min
resource    GPU memory used            > 92% for 5 min
resource    GPU utilisation            > 95% for 10 min (watch)
resource    CPU utilisation            > 85% for 5 min
scheduling  queue depth                > servable concurrency for 1 min
scheduling  instance restarts          > 2 per instance per hour
=========== ========================== ==================================

Timeouts cut by the client or a gateway are invisible to the engine: watch the gateway's own 5xx
counters (e.g. HAProxy's ``haproxy_backend_http_responses_total{code="5xx"}``) beside these.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "AlertConfig",
    "AlertSpec",
    "E2E_HISTOGRAM",
    "alert_specs",
    "cpu_utilisation_query",
    "error_rate_query",
    "gpu_memory_ratio_query",
    "gpu_utilisation_query",
    "mean_latency_query",
    "prometheus_rule",
    "quantile_query",
    "queue_depth_query",
    "restarts_query",
    "rule_file",
    "selector",
    "write_alerts",
]

#: vLLM's end-to-end request latency histogram (seconds).
E2E_HISTOGRAM = "vllm:e2e_request_latency_seconds"
#: vLLM's gauge of requests waiting for a running slot.
QUEUE_GAUGE = "vllm:num_requests_waiting"
#: The HTTP request counter of vLLM's OpenAI server (prometheus-fastapi-instrumentator).
HTTP_REQUESTS = "http_requests_total"
#: kube-state-metrics' container restart counter.
RESTARTS_COUNTER = "kube_pod_container_status_restarts_total"
#: DCGM exporter: frame buffer used / free (MiB) and GPU utilisation (percent).
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
#: node_exporter's per-CPU time counter.
NODE_CPU = "node_cpu_seconds_total"

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d|w|y)$")
_MATCHER = re.compile(r'^\s*[A-Za-z_][A-Za-z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*$')


def _duration(value: str, what: str) -> str:
    if not _DURATION.match(value):
        raise ValueError(f"{what}: {value!r} is not a Prometheus duration (e.g. 30s, 5m, 1h)")
    return value


def _split_matchers(extra: str) -> list[str]:
    """Split ``a="x",b=~"y,z"`` at the commas outside quotes; check each matcher."""
    parts: list[str] = []
    buf = ""
    in_quotes = False
    escaped = False
    for ch in extra:
        if escaped:
            buf += ch
            escaped = False
            continue
        if ch == "\\":
            buf += ch
            escaped = True
            continue
        if ch == '"':
            in_quotes = not in_quotes
        if ch == "," and not in_quotes:
            parts.append(buf)
            buf = ""
            continue
        buf += ch
    parts.append(buf)
    out = [p.strip() for p in parts if p.strip()]
    for p in out:
        if not _MATCHER.match(p):
            raise ValueError(f'label matcher {p!r}: expected name="value" (or !=, =~, !~)')
    return out


def selector(*matchers: str, extra: str = "") -> str:
    """Build a PromQL label selector ``{a="x",b=~"y"}`` from fixed matchers and a user's extra ones.

    Args:
        matchers: matchers the query needs (e.g. ``'status=~"5.."'``); empty strings are skipped.
        extra: comma-separated matchers the user adds (e.g. ``'namespace="llm",job="vllm"'``).

    Returns:
        ``""`` when there is no matcher at all, else ``{...}``.

    Raises:
        ValueError: a malformed matcher in ``extra``.
    """
    parts = [m for m in matchers if m] + _split_matchers(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def error_rate_query(window: str = "2m", extra: str = "") -> str:
    """Share of the inference API's HTTP requests answered with 5xx, over ``window``.

    ``sum(rate(http_requests_total{handler=~"/v1/.*",status=~"5.."}[w])) /
    sum(rate(http_requests_total{handler=~"/v1/.*"}[w]))`` (a fraction, 0..1). The status regex
    matches both the grouped ``5xx`` label of vLLM's instrumentator and exact codes.
    """
    w = _duration(window, "window")
    num = selector('handler=~"/v1/.*"', 'status=~"5.."', extra=extra)
    den = selector('handler=~"/v1/.*"', extra=extra)
    return f"sum(rate({HTTP_REQUESTS}{num}[{w}])) / sum(rate({HTTP_REQUESTS}{den}[{w}]))"


def quantile_query(
    quantile: float = 0.99, window: str = "2m", extra: str = "", histogram: str = E2E_HISTOGRAM
) -> str:
    """Latency quantile (seconds) from a Prometheus histogram, all instances together.

    ``histogram_quantile(q, sum by (le) (rate(<histogram>_bucket{...}[w])))``.

    Raises:
        ValueError: ``quantile`` outside (0, 1) or a malformed window/matcher.
    """
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile!r}")
    w = _duration(window, "window")
    return (
        f"histogram_quantile({quantile:g}, sum by (le) "
        f"(rate({histogram}_bucket{selector(extra=extra)}[{w}])))"
    )


def mean_latency_query(window: str = "2m", extra: str = "", histogram: str = E2E_HISTOGRAM) -> str:
    """Mean latency (seconds) from a histogram's ``_sum`` and ``_count`` over ``window``."""
    w = _duration(window, "window")
    sel = selector(extra=extra)
    return f"sum(rate({histogram}_sum{sel}[{w}])) / sum(rate({histogram}_count{sel}[{w}]))"


def queue_depth_query(extra: str = "") -> str:
    """Requests waiting per instance (vLLM's ``vllm:num_requests_waiting``, summed by instance)."""
    return f"sum by (instance) ({QUEUE_GAUGE}{selector(extra=extra)})"


def restarts_query(window: str = "1h", extra: str = "") -> str:
    """Container restarts per pod/container over ``window`` (kube-state-metrics)."""
    w = _duration(window, "window")
    return (
        f"sum by (namespace, pod, container) "
        f"(increase({RESTARTS_COUNTER}{selector(extra=extra)}[{w}]))"
    )


def gpu_memory_ratio_query(extra: str = "") -> str:
    """GPU frame-buffer used share per GPU (0..1) from the DCGM exporter: USED / (USED + FREE)."""
    sel = selector(extra=extra)
    return f"{DCGM_FB_USED}{sel} / ({DCGM_FB_USED}{sel} + {DCGM_FB_FREE}{sel})"


def gpu_utilisation_query(extra: str = "") -> str:
    """GPU utilisation per GPU as a share (0..1): the DCGM exporter's percent divided by 100."""
    return f"{DCGM_GPU_UTIL}{selector(extra=extra)} / 100"


def cpu_utilisation_query(window: str = "2m", extra: str = "") -> str:
    """CPU utilisation per node (0..1) from node_exporter: 1 - the idle share over ``window``."""
    w = _duration(window, "window")
    sel = selector('mode="idle"', extra=extra)
    return f"1 - avg by (instance) (rate({NODE_CPU}{sel}[{w}]))"


@dataclass(frozen=True)
class AlertConfig:
    """Inputs of the alert rules.

    Attributes:
        target_p99_s: the service's P99 latency target (seconds); the alert fires at 1.5x it.
        target_mean_s: the mean response time target (seconds); default 2 s, the chat P50 SLO.
        servable_concurrency: requests one instance serves at once (vLLM ``--max-num-seqs``);
            the queue-depth alert fires when more than that many wait on one instance.
        rate_window: window of every ``rate()`` (the ``for:`` durations carry the table's minutes);
            it must hold at least two scrapes: the default 2m suits Prometheus' default 1m
            scrape interval (``promtool test rules`` shows a 1m window returns nothing there).
        selector: extra label matchers for the inference metrics and restarts
            (e.g. ``'namespace="llm"'``).
        gpu_selector: extra label matchers for the DCGM metrics.
        node_selector: extra label matchers for node_exporter's CPU metric.
        name: the PrometheusRule's ``metadata.name`` and the groups' name prefix.
        namespace: the PrometheusRule's namespace (omitted when ``None``).
        rule_labels: labels on the PrometheusRule object (the Prometheus Operator's
            ``ruleSelector`` must match them).
    """

    target_p99_s: float = 10.0
    target_mean_s: float = 2.0
    servable_concurrency: float = 20.0
    rate_window: str = "2m"
    selector: str = ""
    gpu_selector: str = ""
    node_selector: str = ""
    name: str = "chaoslib-infer-alerts"
    namespace: str | None = None
    rule_labels: dict[str, str] = field(
        default_factory=lambda: {"prometheus": "k8s", "role": "alert-rules"}
    )

    def validate(self) -> None:
        """Raise ``ValueError`` (one line) on a non-positive target or malformed matcher."""
        for name in ("target_p99_s", "target_mean_s", "servable_concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        _duration(self.rate_window, "rate_window")
        for extra in (self.selector, self.gpu_selector, self.node_selector):
            selector(extra=extra)


@dataclass(frozen=True)
class AlertSpec:
    """One alert of the alert table.

    Attributes:
        alert: the alert name.
        layer: ``business`` | ``resource`` | ``scheduling``.
        signal: what is watched, in the table's words.
        query: the PromQL of the watched value (no comparison).
        op: ``>``.
        threshold: the value that fires (unit as the query's).
        for_: how long it must hold (Prometheus duration).
        severity: ``page`` | ``ticket`` | ``watch``.
        summary: one line for the notification.
    """

    alert: str
    layer: str
    signal: str
    query: str
    op: str
    threshold: float
    for_: str
    severity: str
    summary: str

    @property
    def expr(self) -> str:
        """The rule's expression: ``(<query>) > threshold``."""
        return f"({self.query}) {self.op} {self.threshold:g}"

    def rule(self) -> dict[str, Any]:
        """The Prometheus alerting rule mapping."""
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, "layer": self.layer},
            "annotations": {
                "summary": self.summary,
                "description": f'{self.signal}: {{{{ $value | printf "%.4g" }}}} {self.op} '
                f"{self.threshold:g} "
                f"for {self.for_} (chaoslib-infer, docs/definitions.md alert table)",
                "threshold": f"{self.threshold:g}",
            },
        }


def alert_specs(cfg: AlertConfig | None = None) -> list[AlertSpec]:
    """The alert table as :class:`AlertSpec` rows, in the table's order.

    Raises:
        ValueError: an invalid :class:`AlertConfig`.
    """
    cfg = cfg or AlertConfig()
    cfg.validate()
    w = cfg.rate_window
    return [
        AlertSpec(
            "InferenceErrorRateHigh",
            "business",
            "error rate (HTTP 5xx share)",
            error_rate_query(w, cfg.selector),
            ">",
            0.005,
            "3m",
            "page",
            "Inference error rate above 0.5% for 3 minutes",
        ),
        AlertSpec(
            "InferenceP99LatencyHigh",
            "business",
            "P99 E2E latency (s)",
            quantile_query(0.99, w, cfg.selector),
            ">",
            round(1.5 * cfg.target_p99_s, 6),
            "5m",
            "page",
            f"Inference P99 latency above 1.5x its {cfg.target_p99_s:g} s target for 5 minutes",
        ),
        AlertSpec(
            "InferenceMeanLatencyHigh",
            "business",
            "mean E2E latency (s)",
            mean_latency_query(w, cfg.selector),
            ">",
            float(cfg.target_mean_s),
            "10m",
            "ticket",
            f"Inference mean response time above its {cfg.target_mean_s:g} s target for 10 minutes",
        ),
        AlertSpec(
            "GPUMemoryHigh",
            "resource",
            "GPU memory used share",
            gpu_memory_ratio_query(cfg.gpu_selector),
            ">",
            0.92,
            "5m",
            "page",
            "GPU memory above 92% for 5 minutes",
        ),
        AlertSpec(
            "GPUUtilisationHigh",
            "resource",
            "GPU utilisation share",
            gpu_utilisation_query(cfg.gpu_selector),
            ">",
            0.95,
            "10m",
            "watch",
            "GPU utilisation above 95% for 10 minutes (watch)",
        ),
        AlertSpec(
            "NodeCPUHigh",
            "resource",
            "CPU utilisation share",
            cpu_utilisation_query(w, cfg.node_selector),
            ">",
            0.85,
            "5m",
            "ticket",
            "CPU utilisation above 85% for 5 minutes",
        ),
        AlertSpec(
            "InferenceQueueTooDeep",
            "scheduling",
            "requests waiting per instance",
            queue_depth_query(cfg.selector),
            ">",
            float(cfg.servable_concurrency),
            "1m",
            "page",
            f"More requests waiting than one instance serves at once "
            f"({cfg.servable_concurrency:g}) for 1 minute",
        ),
        AlertSpec(
            "InferenceInstanceRestarts",
            "scheduling",
            "container restarts in the last hour",
            restarts_query("1h", cfg.selector),
            ">",
            2.0,
            "0s",
            "page",
            "An inference instance restarted more than 2 times in the last hour",
        ),
    ]


def rule_file(cfg: AlertConfig | None = None) -> dict[str, Any]:
    """The plain Prometheus rule file (``rule_files:`` format), one group per layer."""
    specs = alert_specs(cfg)
    name = (cfg or AlertConfig()).name
    groups = []
    for layer in ("business", "resource", "scheduling"):
        groups.append(
            {
                "name": f"{name}.{layer}",
                "rules": [s.rule() for s in specs if s.layer == layer],
            }
        )
    return {"groups": groups}


def prometheus_rule(cfg: AlertConfig | None = None) -> dict[str, Any]:
    """The same rules as a Prometheus Operator ``PrometheusRule`` (monitoring.coreos.com/v1)."""
    cfg = cfg or AlertConfig()
    metadata: dict[str, Any] = {"name": cfg.name, "labels": dict(cfg.rule_labels)}
    if cfg.namespace:
        metadata["namespace"] = cfg.namespace
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": rule_file(cfg),
    }


def write_alerts(out_dir: Path, cfg: AlertConfig | None = None) -> tuple[Path, Path]:
    """Write ``alert-rules.yaml`` (plain rule file) and ``prometheusrule.yaml`` into ``out_dir``.

    Returns:
        ``(rule_file_path, prometheus_rule_path)``.

    Raises:
        ValueError: an invalid :class:`AlertConfig`.
        OSError: ``out_dir`` cannot be written.
    """
    cfg = cfg or AlertConfig()
    header = (
        "# Generated by `chaos-infer alerts`: the alert table of docs/definitions.md "
        f"(target P99 {cfg.target_p99_s:g} s, mean {cfg.target_mean_s:g} s, "
        f"servable concurrency {cfg.servable_concurrency:g}).\n"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    plain = out_dir / "alert-rules.yaml"
    operator_rule = out_dir / "prometheusrule.yaml"

    def _dump(doc: dict[str, Any]) -> str:
        return header + yaml.safe_dump(doc, sort_keys=False, width=1000, allow_unicode=True)

    plain.write_text(_dump(rule_file(cfg)), encoding="utf-8")
    operator_rule.write_text(_dump(prometheus_rule(cfg)), encoding="utf-8")
    return plain, operator_rule
