"""The lab's gateway choice (issue 14), without a lab: config rendering and refusal, the nginx
request log, the upstream mirror, secret scrubbing, the gateway figures, plan and CLI input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.lab import gateways
from chaoslib_infer.lab import haproxy as hap
from chaoslib_infer.lab.gateways import nginx
from chaoslib_infer.lab.gateways.figures import gateway_figures, stream_gaps
from chaoslib_infer.lab.gateways.sync import in_service
from chaoslib_infer.plan import load_plan
from chaoslib_infer.verdict import criteria_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "gateways" / "nginx"
SERVERS = [{"name": "r0", "addr": "127.0.0.1:4001"}, {"name": "r1", "addr": "127.0.0.1:4002"}]
needs_nginx = pytest.mark.skipif(nginx.find_nginx() is None, reason="nginx not installed")


def _render(tmp: Path, text: str | None) -> str:
    return nginx.render_config(tmp, "t", 8800, SERVERS, text, "cfg")


def test_location_snippet_goes_inside_the_labs_server(tmp_path: Path) -> None:
    out = _render(tmp_path, "location / { proxy_pass http://{{ upstream }}; }")
    assert "listen 127.0.0.1:8800;" in out and "proxy_pass http://lab_engines;" in out
    assert "server 127.0.0.1:4001;  # r0" in out and "log_format chaos_infer" in out
    assert f"access_log {tmp_path / 'gateway-requests.log'} chaos_infer;" in out


def test_server_block_and_full_config(tmp_path: Path) -> None:
    server = (
        "server {\n  listen {{ listen }};\n  location / { proxy_pass http://{{ upstream }}; }\n}"
    )
    out = _render(tmp_path, server)
    assert out.count("server {") == 1 and "{{" not in out
    full = (
        "events {}\nhttp {\n  {{ lab_http }}\n  upstream mine {\n"
        "  {% for s in servers %}  server {{ s.addr }} max_fails=3;\n  {% endfor %}}\n"
        "  server { listen {{ listen }}; location / { proxy_pass http://mine; } }\n}\n"
    )
    out = _render(tmp_path, full)
    assert "server 127.0.0.1:4002 max_fails=3;" in out and "lab_engines" not in out
    with pytest.raises(nginx.NginxError, match=r"must place \{\{ lab_http \}\}"):
        _render(tmp_path, "events {}\nhttp { server { listen {{ listen }}; } }\n")


def test_template_errors_and_lab_directives_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(nginx.NginxError, match="'upstrem' is undefined"):
        _render(tmp_path, "location / { proxy_pass http://{{ upstrem }}; }")
    with pytest.raises(nginx.NginxError, match="sets 'pid'"):
        _render(tmp_path, "pid /run/x.pid;\nlocation / { proxy_pass http://{{ upstream }}; }")
    assert "server 127.0.0.1:9 down;" in nginx.upstream_block([])


@needs_nginx
def test_nginx_t_refuses_a_broken_config_before_anything_starts() -> None:
    with pytest.raises(gateways.GatewayError) as exc:
        gateways.precheck("nginx", EXAMPLES / "broken.conf", ["r0", "r1"])
    msg = str(exc.value)
    assert "\n" not in msg and 'invalid value "sometimes" in "proxy_buffering"' in msg
    for name in (
        "good",
        "buffering",
        "idle-timeout",
        "read-timeout-client-retries",
        "router-retries",
        "fail-fast",
        "full-nginx",
    ):
        gateways.precheck("nginx", EXAMPLES / f"{name}.conf", ["r0", "r1", "r2"])
    gateways.precheck("nginx", None, ["r0"])


def test_gateway_choice_refusals(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CHAOS_INFER_LITELLM", str(tmp_path / "no-litellm"))
    with pytest.raises(gateways.GatewayError, match="litellm not found: scripts/quickstart"):
        gateways.check_choice("litellm", None)
    with pytest.raises(gateways.GatewayError, match="must be one of"):
        gateways.check_choice("envoy", None)
    assert gateways.check_choice("haproxy", None) is None  # the lab's own settings
    with pytest.raises(gateways.GatewayError, match="cannot read it"):
        gateways.check_choice("haproxy", tmp_path / "no.cfg")


def test_nginx_log_lines_read_as_request_log_entries(tmp_path: Path) -> None:
    (tmp_path / nginx.SERVERS_FILE).write_text(
        json.dumps({"127.0.0.1:4001": "r0", "127.0.0.1:4002": "r1"})
    )
    log = tmp_path / "haproxy-requests.log"
    log.write_text(
        'G1 1000.500 0.500 200 "127.0.0.1:4001" "200" "0.000" "0.010" "0.500" 844 {abc} '
        '"POST /v1/chat/completions HTTP/1.1"\n'
        'G1 1002.000 1.001 504 "127.0.0.1:4001, 127.0.0.1:4002" "504, 504" "0.000, 0.001" '
        '"-, -" "1.000, 0.001" 160 {def} "POST /v1/chat/completions HTTP/1.1"\n'
        'G1 1003.000 0.000 502 "-" "-" "-" "-" "-" 150 {-} "GET / HTTP/1.1"\n'
    )
    a, b, c = hap.parse_request_log(log)
    assert (a.server, a.status, a.request_id, a.ta_ms, a.retries) == ("r0", 200, "abc", 500, "0")
    assert a.accept_t == pytest.approx(1000.0) and a.forwarded_t == pytest.approx(1000.0)
    assert (b.server, b.status, b.retries, b.term_state) == ("r1", 504, "1", "SH--")
    assert c.server == "<NOSRV>" and c.forwarded_t is None and c.request_id is None


def test_upstream_mirror_keeps_ready_servers_only() -> None:
    rows = {
        "r0": {"srv_admin_state": "1", "srv_addr": "127.0.0.1", "srv_port": "1"},  # maint
        "r0-jitter": {"srv_admin_state": "0", "srv_addr": "127.0.0.1", "srv_port": "9"},
        "r1": {"srv_admin_state": "0", "srv_addr": "10.213.1.2", "srv_port": "2"},
        "r2": {"srv_admin_state": "8", "srv_addr": "127.0.0.1", "srv_port": "3"},  # draining
    }
    assert in_service(rows) == [
        {"name": "r0-jitter", "addr": "127.0.0.1:9"},
        {"name": "r1", "addr": "10.213.1.2:2"},
    ]


def test_config_in_the_evidence_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAOS_INFER_API_KEY", "sk-live-0123456789abcdef")
    text = (
        'proxy_set_header Authorization "Bearer sk-live-0123456789abcdef";\n'
        "    api_key: os.environ/OTHER_KEY_VALUE_123\n"
        "proxy_read_timeout 60s;\n"
    )
    out = gateways.redact_config(text)
    assert "0123456789abcdef" not in out and "OTHER_KEY_VALUE_123" not in out
    assert "proxy_read_timeout 60s;" in out


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_gateway_figures_from_records_ledger_and_log(tmp_path: Path) -> None:
    lab, drill = tmp_path / "lab", tmp_path / "drill"
    lab.mkdir()
    drill.mkdir()
    (lab / "gateway.json").write_text(
        json.dumps({"gateway": "nginx", "direct_first_token_gap_s": 0.001})
    )
    (lab / nginx.SERVERS_FILE).write_text(json.dumps({"127.0.0.1:1": "r0", "127.0.0.1:2": "r1"}))
    (lab / nginx.ACCESS_LOG).write_text(
        'G1 101.000 1.000 504 "127.0.0.1:1, 127.0.0.1:2" "504, 200" "0, 0" "-, 0.1" "1, 0" 9 '
        '{a} "POST /v1/chat/completions HTTP/1.1"\n'
        'G1 103.000 0.500 200 "127.0.0.1:2" "200" "0" "0.1" "0.5" 9 {b} "POST / HTTP/1.1"\n'
    )
    _write_jsonl(
        lab / "ledger.jsonl",
        [
            {"t": 100.1, "event": "generation", "replica": "r0", "request_id": "a"},
            {"t": 100.6, "event": "generation", "replica": "r1", "request_id": "a"},
            {"t": 102.6, "event": "generation", "replica": "r1", "request_id": "b"},
        ],
    )
    _write_jsonl(lab / "ttft.jsonl", [{"request_id": "b", "t": 102.7, "ttft_s": 0.1}])
    _write_jsonl(lab / "events.jsonl", [{"t": 99.0, "event": "exit", "replica": "r0"}])
    _write_jsonl(
        drill / "records.jsonl",
        [
            {"request_id": "a", "attempt": 1, "sent_at": 100.0, "end_at": 101.0, "status": 504},
            {
                "request_id": "b",
                "attempt": 1,
                "sent_at": 102.5,
                "first_token_at": 103.0,
                "end_at": 103.0,
                "status": 200,
                "ok": False,
                "error_class": "truncated",
            },
        ],
    )
    fig = gateway_figures(lab, drill)
    assert fig["gateway"] == "nginx"
    assert fig["gateway_timeout_s"] == 1.0 and fig["gateway_gave_up"] == 1
    assert fig["retry_amplification"] == 2.0  # request a: two generations for one attempt
    assert fig["gateway_retries"] == 1 and fig["routed_to_down"] == 1  # r0 had exited
    # ... 1 s before: within the grace a health check needs to see it (issue 30: judged)
    assert fig["routed_to_down_late"] == 0
    _write_jsonl(lab / "events.jsonl", [{"t": 97.0, "event": "exit", "replica": "r0"}])
    late = gateway_figures(lab, drill)
    assert (late["routed_to_down"], late["routed_to_down_late"]) == (1, 1)  # 3 s after its exit
    _write_jsonl(lab / "events.jsonl", [{"t": 99.0, "event": "exit", "replica": "r0"}])
    assert fig["stream_buffering_s"] == pytest.approx(0.299, abs=1e-3)
    assert fig["streams_cut_200"] == 1
    (lab / "gateway.json").write_text(json.dumps({"gateway": "haproxy"}))
    assert gateway_figures(lab, drill) == {}
    assert stream_gaps([{"request_id": "x", "first_token_at": 1.0}], []) == []


def test_gateway_criteria_only_where_a_drill_asks() -> None:
    jitter = {c.name: c for c in criteria_for("network-jitter")}
    assert jitter["retry_amplification"].threshold == 1.0
    assert {c.name: c for c in criteria_for("upstream-timeout")}["gateway_timeout_s"].threshold == 5
    assert "streams_cut_200" in {c.name for c in criteria_for("quota-cut")}
    routed = {c.name: c for c in criteria_for("node-loss")}["routed_to_down_late"]
    assert (routed.op, routed.threshold) == ("<=", 0.0)  # judged (issue 30)


def test_plan_gateway_fields(tmp_path: Path) -> None:
    (tmp_path / "gw.conf").write_text("location / { proxy_pass http://{{ upstream }}; }\n")
    base = {
        "name": "p",
        "drills": [
            {"name": "quota-cut", "experiment": str(ROOT / "experiments" / "quota-cut.yaml")}
        ],
    }
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump({**base, "lab": {"gateway": "nginx", "gateway_config": "gw.conf"}})
    )
    assert load_plan(plan).lab.options["gateway_config"] == str(tmp_path / "gw.conf")
    plan.write_text(yaml.safe_dump({**base, "lab": {"gateway": "envoy"}}))
    with pytest.raises(ConfigError, match="lab.gateway"):
        load_plan(plan)
    plan.write_text(
        yaml.safe_dump({**base, "lab": {"gateway": "nginx", "gateway_config": "no.conf"}})
    )
    with pytest.raises(ConfigError, match="no such file"):
        load_plan(plan)


@needs_nginx
def test_cli_refuses_a_broken_gateway_config_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "chaoslib_infer.cli", "lab", "up", "--gateway", "nginx"]
        + ["--gateway-config", str(EXAMPLES / "broken.conf"), "--port", "0"]
        + ["--state-dir", str(tmp_path / "lab")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "nginx rejected it" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "lab" / "lab.json").exists()  # nothing started
