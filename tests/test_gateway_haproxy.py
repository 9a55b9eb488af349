"""HAProxy with the user's config (issue 23 item 2), without a lab: the template, what the lab
injects and refuses (one line each), ``haproxy -c``, HAProxy's request log lines (real lines,
from an upstream-timeout drill through ``examples/gateways/haproxy/good.cfg``) and the gateway
figures computed from them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from chaoslib_infer.cli.common import apply_gateway
from chaoslib_infer.lab import gateways
from chaoslib_infer.lab.gateways import haproxy_user as hu
from chaoslib_infer.lab.gateways.figures import gateway_figures
from chaoslib_infer.lab.haproxy import LOG_FORMAT, find_haproxy
from chaoslib_infer.lab.requestlog import parse_request_log

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "gateways" / "haproxy"
needs_haproxy = pytest.mark.skipif(find_haproxy() is None, reason="haproxy not installed")
SOCK = Path("/lab/haproxy.sock")
MINIMAL = """\
defaults
    mode http
    timeout connect 1s
    timeout client 10s
    timeout server 10s
frontend lab
    bind {{ listen }}
    default_backend engines
backend engines
    {{ server_lines }}
"""


def _vars(names: tuple[str, ...] = ("r0", "r1")) -> dict[str, Any]:
    rows = [{"name": n, "host": "127.0.0.1", "port": 4001 + i} for i, n in enumerate(names)]
    return hu.template_variables("t", 8800, rows, "/health", Path("/lab"))


def _render(text: str, names: tuple[str, ...] = ("r0", "r1")) -> str:
    return hu.render_config(text, _vars(names), SOCK, list(names), "my.cfg")


def _section(cfg: str, header: str) -> list[str]:
    lines = cfg.splitlines()
    start = lines.index(header)
    out = []
    for ln in lines[start + 1 :]:
        if ln and not ln.startswith((" ", "\t")):
            break
        out.append(ln.strip())
    return out


def test_the_lab_injects_its_runtime_socket_and_request_log() -> None:
    cfg = _render(MINIMAL)
    glob = _section(cfg, "global")  # the config had none: the lab adds it
    assert f"stats socket {SOCK} mode 600 level admin" in glob
    assert "log stdout format raw local0" in glob
    front = _section(cfg, "frontend lab")
    assert f'log-format "{LOG_FORMAT}"' in front and "log global" in front
    assert "capture request header X-Request-Id len 64" in front and "mode http" in front
    assert "bind 127.0.0.1:8800" in front
    back = _section(cfg, "backend engines")
    assert "server r0 127.0.0.1:4001 check" in back and "server r1 127.0.0.1:4002 check" in back
    # the user's own global section keeps its lines, the lab's go first
    cfg = _render("global\n    nbthread 2\n" + MINIMAL)
    assert _section(cfg, "global")[-1] == "nbthread 2" and cfg.count("\nglobal") == 0


def test_standby_replicas_are_disabled_and_servers_loop_renders() -> None:
    meta = {
        "lab_id": "t",
        "port": 8800,
        "replicas": [{"name": "r0", "port": 4001}, {"name": "r1", "port": 4002, "standby": True}],
    }
    own = MINIMAL.replace(
        "{{ server_lines }}",
        "{% for s in servers %}server {{ s.name }} {{ s.addr }} check inter 2s\n    {% endfor %}",
    )
    cfg = hu.lab_config(meta, Path("/lab"), "/health", own, "own.cfg")
    back = _section(cfg, "backend engines")
    assert "server r0 127.0.0.1:4001 check inter 2s" in back
    assert "server r1 127.0.0.1:4002 check inter 2s disabled" in back


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MINIMAL.replace("{{ listen }}", "{{ listen_addr }}"), "template error: 'listen_addr'"),
        ("global\n    stats socket /run/haproxy.sock\n" + MINIMAL, "'stats socket' in global"),
        ("global\n    daemon\n" + MINIMAL, "'daemon' in global: the lab runs HAProxy in the"),
        ("global\n    user haproxy\n" + MINIMAL, "'user' in global: the lab runs HAProxy unpriv"),
        ("global\n    log stdout local0\n" + MINIMAL, "'log stdout' in global"),
        (
            MINIMAL.replace("mode http", "mode http\n    log stderr local0"),
            "'log stderr' in defaults",
        ),
        (
            MINIMAL.replace("default_backend", "option httplog\n    default_backend"),
            "'option httplog' in the lab's frontend: the lab owns its request log",
        ),
        (
            MINIMAL.replace("default_backend", 'log-format "%s"\n    default_backend'),
            "'log-format' in the lab's frontend",
        ),
        (
            MINIMAL.replace("default_backend", "log 127.0.0.1:514 local0\n    default_backend"),
            "a 'log' target in the lab's frontend",
        ),
        (
            MINIMAL.replace("mode http", "mode http\n    option dontlog-normal"),
            "'option dontlog-normal' in defaults: it drops the lab's request log",
        ),
        (MINIMAL.replace("{{ listen }}", "127.0.0.1:9999"), "0 frontend sections bind"),
        (MINIMAL.replace("backend engines", "backend llm"), "0 'backend engines' sections"),
        (
            MINIMAL.replace("{{ server_lines }}", "server r0 127.0.0.1:4001"),
            "backend engines has 0 'server r1' lines, expected 1 per replica",
        ),
    ],
)
def test_refusals_are_one_line(text: str, expected: str) -> None:
    with pytest.raises(hu.HAProxyConfigError) as exc:
        _render(text)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("my.cfg"), msg
    assert expected in msg, msg


def test_a_refusal_names_the_rendered_line() -> None:
    with pytest.raises(hu.HAProxyConfigError) as exc:
        _render("global\n    chroot /var/lib/haproxy\n" + MINIMAL)
    assert "(rendered haproxy.cfg line 2: 'chroot /var/lib/haproxy')" in str(exc.value)


@needs_haproxy
def test_haproxy_c_refuses_the_broken_example_and_accepts_the_others() -> None:
    with pytest.raises(gateways.GatewayError) as exc:
        gateways.precheck("haproxy", EXAMPLES / "broken.cfg", ["r0", "r1"])
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(EXAMPLES / "broken.cfg"))
    assert "haproxy rejected it: 'timeout server' : unexpected extra argument 'seconds'" in msg
    assert "(rendered haproxy.cfg line " in msg
    for name in ("good", "weak", "fail-fast"):
        gateways.precheck("haproxy", EXAMPLES / f"{name}.cfg", ["r0", "r1", "r2"])
    gateways.precheck("haproxy", None, ["r0"])  # the lab's own settings: nothing to check


@needs_haproxy
def test_cli_refuses_a_broken_haproxy_config_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "chaoslib_infer.cli", "lab", "up", "--gateway", "haproxy"]
        + ["--gateway-config", str(EXAMPLES / "broken.cfg"), "--port", "0"]
        + ["--state-dir", str(tmp_path / "lab")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "haproxy rejected it" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "lab" / "lab.json").exists()  # nothing started


def test_a_haproxy_config_on_the_cli_replaces_the_plans_gateway_retry() -> None:
    plan = SimpleNamespace(lab=SimpleNamespace(options={"gateway_retry": True}))
    apply_gateway(plan, "haproxy", EXAMPLES / "good.cfg")
    assert plan.lab.options == {
        "gateway": "haproxy",
        "gateway_config": str((EXAMPLES / "good.cfg").resolve()),
    }
    plan = SimpleNamespace(lab=SimpleNamespace(options={"gateway_retry": True}))
    apply_gateway(plan, "haproxy", None)  # the lab's own settings keep it
    assert plan.lab.options["gateway_retry"] is True


# Real lines of haproxy-requests.log (the lab's LOG_FORMAT), from `drill run upstream-timeout
# --gateway haproxy --gateway-config examples/gateways/haproxy/good.cfg`: a health probe, a
# plain stream, one redispatched after its 3 s response timeout on the frozen replica (+1, the
# 3 s counted in %Tw), one the client abandoned mid-stream when the load stopped (CD--).
REAL_LINES = [
    '1796354782.096 r2 200 0 0 0 0 153 ---- 0 {} "GET /health HTTP/1.1" 0 0 0',
    "1796354784.930 r0 200 0 0 5 473 6328 ---- 0 {ceefbd53-0000-4000-8000-000000000006} "
    '"POST /v1/chat/completions HTTP/1.1" 0 152 0',
    "1796354793.161 r1 200 3000 0 1 3471 6323 ---- +1 {ceefbd53-0000-4000-8000-000000000040} "
    '"POST /v1/chat/completions HTTP/1.1" 0 479 0',
    "1796354817.283 r1 200 0 0 5 479 6316 CD-- 0 {ceefbd53-0000-4000-8000-000000000109} "
    '"POST /v1/chat/completions HTTP/1.1" 0 2172 0',
]


def test_real_haproxy_log_lines_parse(tmp_path: Path) -> None:
    log = tmp_path / "haproxy-requests.log"
    log.write_text("\n".join(REAL_LINES) + "\nnot a log line\n")
    health, plain, retried, cut = parse_request_log(log)
    assert (health.server, health.status, health.request_id) == ("r2", 200, None)
    assert (plain.server, plain.tr_ms, plain.ta_ms, plain.retries) == ("r0", 5, 473, "0")
    assert plain.request_t == pytest.approx(1796354784.930 + 0.152)  # keep-alive idle (%Ti)
    assert plain.forwarded_t == pytest.approx(plain.request_t)
    assert (retried.server, retried.tw_ms, retried.retries) == ("r1", 3000, "+1")
    assert retried.forwarded_t == pytest.approx(1796354793.161 + 0.479 + 3.0)
    assert (cut.term_state, cut.ta_ms, cut.request_id) == (
        "CD--",
        479,
        "ceefbd53-0000-4000-8000-000000000109",
    )


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_gateway_figures_for_haproxy_with_your_config(tmp_path: Path) -> None:
    lab, drill = tmp_path / "lab", tmp_path / "drill"
    lab.mkdir()
    drill.mkdir()
    info = {"gateway": "haproxy", "config_path": "/x/good.cfg", "direct_first_token_gap_s": 0.001}
    (lab / "gateway.json").write_text(json.dumps(info))
    # a: redispatched after a 3 s response timeout on r0, served by r1 (the frozen r0 generated
    # it too when it thawed); b: HAProxy's own 504 after 3 s (its timeout server, sH--);
    # c: the client gave up after 10 s on the frozen r0 (CD--); d: a plain stream, then cut by
    # its server (SD--: not the gateway's give-up)
    (lab / "haproxy-requests.log").write_text(
        '100.000 r1 200 3000 0 1 3471 6323 ---- +1 {a} "POST /v1/chat/completions HTTP/1.1" 0 0 0\n'
        '101.000 r0 504 0 0 -1 3001 198 sH-- 0 {b} "POST /v1/chat/completions HTTP/1.1" 0 0 0\n'
        '102.000 r0 -1 0 0 -1 10004 0 CH-- 0 {c} "POST /v1/chat/completions HTTP/1.1" 0 0 0\n'
        '103.000 r2 200 0 0 2 800 900 SD-- 0 {d} "POST /v1/chat/completions HTTP/1.1" 0 0 0\n'
        '99.000 r2 200 0 0 0 0 153 ---- 0 {} "GET /health HTTP/1.1" 0 0 0\n'
    )
    _jsonl(
        lab / "ledger.jsonl",
        [
            {"t": 100.1, "event": "generation", "replica": "r0", "request_id": "a"},
            {"t": 103.2, "event": "generation", "replica": "r1", "request_id": "a"},
            {"t": 103.1, "event": "generation", "replica": "r2", "request_id": "d"},
        ],
    )
    _jsonl(lab / "ttft.jsonl", [{"request_id": "d", "t": 103.2, "ttft_s": 0.1}])
    _jsonl(drill / "faults.jsonl", [{"kind": "upstream-timeout", "replica": "r0",
                                      "fault_at": 100.5, "hold_s": 15}])  # fmt: skip
    _jsonl(
        drill / "records.jsonl",
        [
            {"request_id": "a", "attempt": 1, "sent_at": 100.0, "end_at": 103.5, "status": 200,
             "ok": True, "first_token_at": 103.21},
            {"request_id": "b", "attempt": 1, "sent_at": 101.0, "end_at": 104.0, "status": 504,
             "ok": False},
            {"request_id": "c", "attempt": 1, "sent_at": 102.0, "end_at": 112.0, "status": None,
             "ok": False, "error_class": "timeout_attempt"},
            {"request_id": "d", "attempt": 1, "sent_at": 103.0, "end_at": 103.9, "status": 200,
             "ok": False, "error_class": "truncated", "first_token_at": 103.5},
        ],
    )  # fmt: skip
    fig = gateway_figures(lab, drill)
    assert fig["gateway"] == "haproxy"
    assert fig["gateway_timeout_s"] == 10.004 and fig["gateway_gave_up"] == 2  # c, b
    assert fig["retry_amplification"] == 2.0 and fig["gateway_retries"] == 1
    assert fig["routed_to_down"] == 2  # b and c reached r0 while frozen; a was logged on r1
    assert fig["streams_cut_200"] == 1  # d
    assert fig["stream_buffering_s"] == pytest.approx(0.3 - 0.001, abs=1e-3)  # d: 103.5 - 103.2
    assert "ejection_s" not in fig  # HAProxy's own health view (show stat) stays the drill's
    # HAProxy with the lab's own settings: its rows as before
    (lab / "gateway.json").write_text(json.dumps({"gateway": "haproxy", "config_path": None}))
    assert gateway_figures(lab, drill) == {}
