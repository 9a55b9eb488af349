"""Alert rules (docs/definitions.md alert table) and PromQL probes against a fake Prometheus.

``promtool`` (Debian package ``prometheus``) checks the generated rules and evaluates them on
synthetic series (``promtool test rules``); those tests skip, saying so, where it is absent.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from chaoslib.exceptions import ActivityFailed
from click.testing import CliRunner

from chaoslib_infer import prometheus as pq
from chaoslib_infer.activities import gpu as gpu_probes
from chaoslib_infer.activities import prometheus as probes
from chaoslib_infer.cli import main

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian package 'prometheus'): rule files not checked",
)

# alert -> (for, threshold, substrings its expr must contain), from docs/definitions.md's table
EXPECTED = {
    "InferenceErrorRateHigh": (
        "3m",
        0.005,
        ['http_requests_total{handler=~"/v1/.*",status=~"5.."}', "> 0.005"],
    ),
    "InferenceP99LatencyHigh": (
        "5m",
        3.0,  # 1.5 x --target-p99 2
        ["histogram_quantile(0.99, sum by (le)", "vllm:e2e_request_latency_seconds_bucket", "> 3"],
    ),
    "InferenceMeanLatencyHigh": (
        "10m",
        1.5,
        ["vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count", "> 1.5"],
    ),
    "GPUMemoryHigh": (
        "5m",
        0.92,
        ["DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)", "> 0.92"],
    ),
    "GPUUtilisationHigh": ("10m", 0.95, ["DCGM_FI_DEV_GPU_UTIL / 100", "> 0.95"]),
    "NodeCPUHigh": ("5m", 0.85, ['node_cpu_seconds_total{mode="idle"}', "> 0.85"]),
    "InferenceQueueTooDeep": (
        "1m",
        16.0,
        ["sum by (instance) (vllm:num_requests_waiting)", "> 16"],
    ),
    "InferenceInstanceRestarts": (
        "0s",
        2.0,
        ["increase(kube_pod_container_status_restarts_total[1h])", "> 2"],
    ),
}


def _write(tmp_path: Path) -> tuple[Path, Path]:
    result = CliRunner().invoke(
        main,
        [
            "alerts",
            "--target-p99",
            "2",
            "--target-mean",
            "1.5",
            "--servable-concurrency",
            "16",
            "--out",
            str(tmp_path / "alerts"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "InferenceP99LatencyHigh" in result.output
    return tmp_path / "alerts" / "alert-rules.yaml", tmp_path / "alerts" / "prometheusrule.yaml"


def _rules(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def test_alert_rules_encode_the_seed_table(tmp_path: Path) -> None:
    plain, operator_rule = _write(tmp_path)
    rules = _rules(yaml.safe_load(plain.read_text()))
    assert set(rules) == set(EXPECTED)
    for name, (for_, threshold, parts) in EXPECTED.items():
        rule = rules[name]
        assert rule["for"] == for_, name
        assert float(rule["annotations"]["threshold"]) == pytest.approx(threshold), name
        assert rule["expr"].endswith(f"> {threshold:g}"), rule["expr"]
        for part in parts:
            assert part in rule["expr"], (name, part)
        assert rule["labels"]["layer"] in ("business", "resource", "scheduling")
    cr = yaml.safe_load(operator_rule.read_text())
    assert cr["apiVersion"] == "monitoring.coreos.com/v1"
    assert cr["kind"] == "PrometheusRule"
    assert cr["metadata"]["name"] == "chaoslib-infer-alerts"
    assert _rules(cr["spec"]) == rules


def test_alerts_cli_rejects_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(main, ["alerts", "--selector", "namespace=llm", "--out", str(tmp_path)])
    assert bad.exit_code == 2
    assert "label matcher" in bad.output
    neg = runner.invoke(main, ["alerts", "--target-p99", "0", "--out", str(tmp_path)])
    assert neg.exit_code == 2
    assert "target_p99_s" in neg.output
    assert not (tmp_path / "alert-rules.yaml").exists()


def test_selector_is_added_to_every_inference_query() -> None:
    cfg = pq.AlertConfig(selector='namespace="llm",pod=~"vllm-.*,x"')
    specs = {s.alert: s for s in pq.alert_specs(cfg)}
    for name in (
        "InferenceErrorRateHigh",
        "InferenceP99LatencyHigh",
        "InferenceQueueTooDeep",
        "InferenceInstanceRestarts",
    ):
        assert 'namespace="llm",pod=~"vllm-.*,x"' in specs[name].expr, specs[name].expr
    assert "namespace" not in specs["GPUMemoryHigh"].expr


@needs_promtool
def test_promtool_checks_both_files(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    plain, operator_rule = _write(tmp_path)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(yaml.safe_load(operator_rule.read_text())["spec"]))
    for path in (plain, spec_file):
        proc = subprocess.run(
            [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS: 8 rules found" in proc.stdout + proc.stderr


_RULES: dict[str, dict[str, Any]] = {}


def _alert(name: str, value: str, layer: str, severity: str, **labels: str) -> dict[str, Any]:
    """An expected firing alert; its description carries ``value`` (``printf "%.4g"``)."""
    ann = dict(_RULES[name]["annotations"])
    ann["description"] = ann["description"].replace('{{ $value | printf "%.4g" }}', value)
    return {"exp_labels": {"severity": severity, "layer": layer, **labels}, "exp_annotations": ann}


@needs_promtool
def test_promtool_rules_fire_at_the_seed_thresholds_and_durations(tmp_path: Path) -> None:
    """Real PromQL evaluation: each alert fires only past its threshold and after its ``for``."""
    assert PROMTOOL is not None
    plain, _ = _write(tmp_path)
    _RULES.update(_rules(yaml.safe_load(plain.read_text())))
    h = 'handler="/v1/chat/completions"'
    series = [
        # 1% 5xx on one instance, 0.4% on the other: the sum is 0.7% (> 0.5%)
        {"series": f'http_requests_total{{{h},status="5xx"}}', "values": "0+1x30"},
        {"series": f'http_requests_total{{{h},status="2xx"}}', "values": "0+142x30"},
        # P99: every request 4 s, all in the (2.5, 5] bucket: interpolated 2.5 + 2.5 x 0.99 = 4.975 s
        # (> 3 s = 1.5 x 2); mean 4 s > 1.5 s
        {"series": 'vllm:e2e_request_latency_seconds_bucket{le="2.5"}', "values": "0x30"},
        {"series": 'vllm:e2e_request_latency_seconds_bucket{le="5"}', "values": "0+10x30"},
        {"series": 'vllm:e2e_request_latency_seconds_bucket{le="+Inf"}', "values": "0+10x30"},
        {"series": "vllm:e2e_request_latency_seconds_sum", "values": "0+40x30"},
        {"series": "vllm:e2e_request_latency_seconds_count", "values": "0+10x30"},
        # queue: instance a 17 waiting (> 16), b 16 (not above)
        {"series": 'vllm:num_requests_waiting{instance="a",model_name="m"}', "values": "17x30"},
        {"series": 'vllm:num_requests_waiting{instance="b",model_name="m"}', "values": "16x30"},
        # restarts: 3 in the hour for p1 (> 2), 2 for p2 (not above)
        {
            "series": 'kube_pod_container_status_restarts_total{namespace="llm",pod="p1",container="vllm"}',
            "values": "0 0 1 2 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3",
        },
        {
            "series": 'kube_pod_container_status_restarts_total{namespace="llm",pod="p2",container="vllm"}',
            "values": "0 0 1 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2",
        },
        # GPU memory: gpu 0 at 93% (> 92%), gpu 1 at 91%
        {"series": 'DCGM_FI_DEV_FB_USED{gpu="0"}', "values": "93x30"},
        {"series": 'DCGM_FI_DEV_FB_FREE{gpu="0"}', "values": "7x30"},
        {"series": 'DCGM_FI_DEV_FB_USED{gpu="1"}', "values": "91x30"},
        {"series": 'DCGM_FI_DEV_FB_FREE{gpu="1"}', "values": "9x30"},
        # GPU utilisation 96% on gpu 0 (> 95%) for the whole run: fires only after 10 min
        {"series": 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}', "values": "96x30"},
        # CPU 10% idle (90% busy > 85%)
        {"series": 'node_cpu_seconds_total{instance="n1",cpu="0",mode="idle"}', "values": "0+6x30"},
    ]
    alert_tests = [
        # pending, not firing, before the `for:` has passed
        {"eval_time": "3m", "alertname": "InferenceErrorRateHigh", "exp_alerts": []},
        {
            "eval_time": "5m",
            "alertname": "InferenceErrorRateHigh",
            "exp_alerts": [_alert("InferenceErrorRateHigh", "0.006993", "business", "page")],
        },
        {"eval_time": "5m", "alertname": "InferenceP99LatencyHigh", "exp_alerts": []},
        {
            "eval_time": "7m",
            "alertname": "InferenceP99LatencyHigh",
            "exp_alerts": [_alert("InferenceP99LatencyHigh", "4.975", "business", "page")],
        },
        {"eval_time": "10m", "alertname": "InferenceMeanLatencyHigh", "exp_alerts": []},
        {
            "eval_time": "12m",
            "alertname": "InferenceMeanLatencyHigh",
            "exp_alerts": [_alert("InferenceMeanLatencyHigh", "4", "business", "ticket")],
        },
        {"eval_time": "30s", "alertname": "InferenceQueueTooDeep", "exp_alerts": []},
        {
            "eval_time": "2m",
            "alertname": "InferenceQueueTooDeep",
            "exp_alerts": [
                _alert("InferenceQueueTooDeep", "17", "scheduling", "page", instance="a")
            ],
        },
        {"eval_time": "3m", "alertname": "InferenceInstanceRestarts", "exp_alerts": []},
        {
            "eval_time": "4m",
            "alertname": "InferenceInstanceRestarts",
            "exp_alerts": [
                _alert(
                    "InferenceInstanceRestarts",
                    "3",
                    "scheduling",
                    "page",
                    namespace="llm",
                    pod="p1",
                    container="vllm",
                )
            ],
        },
        {"eval_time": "4m", "alertname": "GPUMemoryHigh", "exp_alerts": []},
        {
            "eval_time": "6m",
            "alertname": "GPUMemoryHigh",
            "exp_alerts": [_alert("GPUMemoryHigh", "0.93", "resource", "page", gpu="0")],
        },
        {"eval_time": "9m", "alertname": "GPUUtilisationHigh", "exp_alerts": []},
        {
            "eval_time": "12m",
            "alertname": "GPUUtilisationHigh",
            "exp_alerts": [_alert("GPUUtilisationHigh", "0.96", "resource", "watch", gpu="0")],
        },
        {
            "eval_time": "7m",
            "alertname": "NodeCPUHigh",
            "exp_alerts": [_alert("NodeCPUHigh", "0.9", "resource", "ticket", instance="n1")],
        },
    ]
    test_file = tmp_path / "alerts" / "alerts_test.yaml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "rule_files": [plain.name],
                "evaluation_interval": "30s",
                "tests": [
                    {"interval": "1m", "input_series": series, "alert_rule_test": alert_tests}
                ],
            }
        )
    )
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


# ---- PromQL probes against a fake Prometheus HTTP API ---------------------------------------


class _FakeProm:
    """``/api/v1/query`` on 127.0.0.1: records each query, answers from ``answers``."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.answers: dict[str, tuple[int, Any]] = {}
        self.delay_s = 0.0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                parsed = urlparse(self.path)
                query = parse_qs(parsed.query).get("query", [""])[0]
                if parsed.path != "/api/v1/query":
                    code, body = 404, {"status": "error", "error": "not found"}
                else:
                    fake.queries.append(query)
                    code, body = fake.answers.get(
                        query,
                        (
                            400,
                            {
                                "status": "error",
                                "errorType": "bad_data",
                                "error": f"unexpected query {query}",
                            },
                        ),
                    )
                if fake.delay_s:
                    time.sleep(fake.delay_s)
                data = json.dumps(body).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (the timeout test)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def vector(self, query: str, *samples: tuple[dict[str, str], str]) -> None:
        self.answers[query] = (
            200,
            {
                "status": "success",
                "data": {
                    "resultType": "vector",
                    "result": [{"metric": m, "value": [1700000000.0, v]} for m, v in samples],
                },
            },
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture()
def prom() -> Iterator[_FakeProm]:
    fake = _FakeProm()
    try:
        yield fake
    finally:
        fake.close()


def test_error_rate_probe_sends_the_alert_query(prom: _FakeProm) -> None:
    q = (
        'sum(rate(http_requests_total{handler=~"/v1/.*",status=~"5..",namespace="llm"}[2m])) / '
        'sum(rate(http_requests_total{handler=~"/v1/.*",namespace="llm"}[2m]))'
    )
    prom.vector(q, ({}, "0.0125"))
    out = probes.error_rate(prom.url, window="2m", selector='namespace="llm"')
    assert prom.queries == [q]
    assert out["value"] == pytest.approx(0.0125)
    assert out["passed"] is False
    assert out["threshold"] == 0.005


def test_p99_probe_from_histogram(prom: _FakeProm) -> None:
    q = "histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket[2m])))"
    prom.vector(q, ({}, "2.375"))
    out = probes.p99_from_histogram(prom.url)
    assert prom.queries == [q]
    assert out["value"] == pytest.approx(2.375)
    assert out["result_type"] == "vector"
    with pytest.raises(ActivityFailed, match="quantile must be in"):
        probes.p99_from_histogram(prom.url, quantile=1.5)


def test_queue_depth_probe_reports_deepest_instance(prom: _FakeProm) -> None:
    q = "sum by (instance) (vllm:num_requests_waiting)"
    prom.vector(q, ({"instance": "a"}, "3"), ({"instance": "b"}, "21"), ({"instance": "c"}, "NaN"))
    out = probes.queue_depth("", configuration={"prometheus_url": prom.url + "/"})
    assert prom.queries == [q]
    assert out["value"] == 21.0
    assert out["max_labels"] == {"instance": "b"}
    assert [s["value"] for s in out["samples"]] == [3.0, 21.0, None]


def test_restarts_probe(prom: _FakeProm) -> None:
    q = (
        "sum by (namespace, pod, container) "
        '(increase(kube_pod_container_status_restarts_total{container="vllm"}[1h]))'
    )
    prom.vector(q, ({"pod": "p1"}, "3"), ({"pod": "p2"}, "0"))
    out = probes.restarts(prom.url, selector='container="vllm"')
    assert prom.queries == [q]
    assert out["value"] == 3.0
    assert out["passed"] is False
    prom.vector(q)  # empty result: no restarts known
    assert probes.restarts(prom.url, selector='container="vllm"')["passed"] is True


def test_dcgm_probes(prom: _FakeProm) -> None:
    q = "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)"
    prom.vector(q, ({"gpu": "0"}, "0.5"), ({"gpu": "1"}, "0.95"))
    out = gpu_probes.dcgm_gpu_memory_used_ratio(prom.url)
    assert out["value"] == 0.95 and out["max_labels"] == {"gpu": "1"}
    assert out["passed"] is False
    q2 = 'DCGM_FI_DEV_GPU_UTIL{Hostname="n1"} / 100'
    prom.vector(q2, ({"gpu": "0"}, "0.4"))
    out2 = gpu_probes.dcgm_gpu_utilization(prom.url, selector='Hostname="n1"')
    assert out2["value"] == 0.4 and out2["passed"] is True
    assert prom.queries == [q, q2]


def test_prometheus_errors_are_one_clear_line(prom: _FakeProm) -> None:
    with pytest.raises(ActivityFailed, match=r"query failed \(bad_data\): unexpected query up"):
        probes.prometheus_query(prom.url, "up")
    prom.answers["up"] = (503, "<html>overloaded</html>")
    with pytest.raises(ActivityFailed, match="HTTP 503, not a Prometheus API answer"):
        probes.prometheus_query(prom.url, "up")
    prom.answers["up"] = (
        200,
        {"status": "success", "data": {"resultType": "matrix", "result": []}},
    )
    with pytest.raises(ActivityFailed, match="unsupported result type 'matrix'"):
        probes.prometheus_query(prom.url, "up")
    prom.answers["1+1"] = (
        200,
        {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "2"]}},
    )
    assert probes.prometheus_query(prom.url, "1+1")["value"] == 2.0
    with pytest.raises(ActivityFailed, match="no URL"):
        probes.prometheus_query("", "up")


def test_prometheus_timeout_and_refused(prom: _FakeProm) -> None:
    prom.vector("up", ({}, "1"))
    prom.delay_s = 1.0
    t0 = time.monotonic()
    with pytest.raises(ActivityFailed, match="no answer within 0.2 s"):
        probes.prometheus_query(prom.url, "up", timeout_s=0.2)
    assert time.monotonic() - t0 < 0.9
    port = prom.server.server_address[1]
    prom.close()
    prom.close = lambda: None  # type: ignore[method-assign]
    with pytest.raises(ActivityFailed, match=rf"prometheus http://127.0.0.1:{port}: ConnectError"):
        probes.prometheus_query(f"http://127.0.0.1:{port}", "up", timeout_s=1)
