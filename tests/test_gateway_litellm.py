"""LiteLLM as the lab's gateway (issue 14): its proxy config (the user's template, the lab's
default, refusals with one line), the lanes HAProxy checks, the intent mirror's commands, and
the gateway figures read from the lanes' log. No LiteLLM process: tests/test_gateway_litellm_lab.py
runs the proxy itself."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from labutil import haproxy_missing

from chaoslib_infer.lab import gateways
from chaoslib_infer.lab.gateways import litellm
from chaoslib_infer.lab.gateways.figures import gateway_figures
from chaoslib_infer.lab.haproxy import find_haproxy, render_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "gateways" / "litellm"
LANES = {"r0": 41000, "r1": 41001, "r2": 41002, "r3": 41003}


def render(text: str | None, in_service: tuple[str, ...] = ("r0", "r1", "r2")) -> dict:
    out = litellm.render_config(text, LANES, list(in_service), 8801, "lab1", "my.yaml")
    cfg = yaml.safe_load(out)
    assert isinstance(cfg, dict)
    return cfg


def test_default_config_one_deployment_per_replica_in_service() -> None:
    cfg = render(None)
    bases = [m["litellm_params"]["api_base"] for m in cfg["model_list"]]
    assert bases == [f"http://127.0.0.1:{p}/v1" for p in (41000, 41001, 41002)]  # not r3
    assert {m["model_name"] for m in cfg["model_list"]} == {"sim"}
    assert cfg["litellm_settings"]["num_retries"] == 0
    assert cfg["general_settings"]["forward_client_headers_to_llm_api"] is True


def test_user_config_keeps_its_settings_and_gets_the_labs_model_list() -> None:
    text = "router_settings:\n  num_retries: 3\n  timeout: 2\n  allowed_fails: 1\n"
    cfg = render(text)
    assert cfg["router_settings"] == {"num_retries": 3, "timeout": 2, "allowed_fails": 1}
    assert len(cfg["model_list"]) == 3
    assert cfg["general_settings"] == {"forward_client_headers_to_llm_api": True}


def test_user_model_list_template_over_all_replicas_and_the_service() -> None:
    text = (
        "model_list:\n"
        "{% for r in all_replicas %}"
        "  - model_name: {{ model }}\n"
        "    litellm_params: {model: openai/{{ model }}, api_base: '{{ r.api_base }}', "
        "stream_timeout: 3}\n"
        "{% endfor %}"
        "  - model_name: fallback\n"
        "    litellm_params: {model: openai/sim, api_base: '{{ service }}'}\n"
    )
    cfg = render(text)
    bases = [m["litellm_params"]["api_base"] for m in cfg["model_list"]]
    assert bases[:4] == [f"http://127.0.0.1:{p}/v1" for p in LANES.values()]
    assert bases[4] == "http://127.0.0.1:8801/v1"
    assert cfg["model_list"][0]["litellm_params"]["stream_timeout"] == 3


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("model_list: [\n", r"my\.yaml line \d+: not valid YAML"),
        ("- a\n- b\n", "a LiteLLM proxy config is a mapping"),
        ("general_settings:\n  master_key: sk-1234\n", "sets general_settings.master_key"),
        ("general_settings:\n  database_url: postgres://x\n", "sets general_settings.database_url"),
        ("model_list:\n  - model_name: sim\n", "each with litellm_params.model"),
        (
            "model_list:\n  - model_name: gpt\n    litellm_params: {model: openai/x}\n",
            "no deployment has model_name 'sim'",
        ),
        ("x: {{ nope }}\n", "my.yaml: template error: 'nope' is undefined"),
        ("{% if %}\n", r"my\.yaml line 1: template error"),
    ],
)
def test_refused_configs_say_why_in_one_line(text: str, match: str) -> None:
    with pytest.raises(litellm.LiteLLMError, match=match) as info:
        render(text)
    assert "\n" not in str(info.value)


@pytest.mark.litellm  # the precheck runs LiteLLM's own config check when it is installed
def test_examples_pass_the_precheck() -> None:
    names = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert "good.yaml" in names and "broken.yaml" in names
    for name in names:
        if name == "broken.yaml":
            with pytest.raises(gateways.GatewayError, match="broken.yaml"):
                gateways.precheck("litellm", EXAMPLES / name, ["r0", "r1", "r2"])
        elif litellm.find_litellm() is not None:
            gateways.precheck("litellm", EXAMPLES / name, ["r0", "r1", "r2"])


@pytest.mark.skipif(haproxy_missing() is not None, reason=haproxy_missing() or "")
def test_lanes_config_is_accepted_by_haproxy(tmp_path: Path) -> None:
    base = render_config("lab1", 8801, [("r0", 5000), ("r1", 5001)], tmp_path / "s.sock")
    lanes = litellm.lanes_config(
        {"r0": 6000, "r1": 6001},
        {"r0": ("127.0.0.1", 5000, False), "r1": ("10.0.0.2", 5001, True)},
    )
    assert "server r1 10.0.0.2:5001 disabled" in lanes
    assert "check" not in lanes.split("backend lane_r0")[1]  # LiteLLM finds failures itself
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(base + "\n" + lanes)
    haproxy = find_haproxy()
    assert haproxy is not None
    proc = subprocess.run([haproxy, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def row(addr: str, port: int, admin: int = 0) -> dict[str, str]:
    return {"srv_addr": addr, "srv_port": str(port), "srv_admin_state": str(admin)}


def test_lane_commands_mirror_maintenance_detours_moves_and_removals() -> None:
    engines = {
        "r0": row("127.0.0.1", 5000, admin=1),  # in maintenance behind the jitter detour
        "r0-jitter": row("127.0.0.1", 7000),
        "r1": row("10.1.0.9", 5001),  # moved to the spare node
        "r2": row("127.0.0.1", 5002, admin=8),  # drained
        "r3": row("127.0.0.1", 5003),  # the autoscaler put it in service
        "r10": row("127.0.0.1", 5010),  # not r1's detour: another replica
    }
    lanes = {
        "r0": {"r0": row("127.0.0.1", 5000)},
        "r1": {"r1": row("127.0.0.1", 5001), "r1-jitter": row("127.0.0.1", 7001)},
        "r2": {"r2": row("127.0.0.1", 5002)},
        "r3": {"r3": row("127.0.0.1", 5003, admin=5)},  # config "disabled" + forced maint
    }
    assert litellm.lane_commands(engines, lanes) == [
        "set server lane_r0/r0 state maint",
        "add server lane_r0/r0-jitter 127.0.0.1:7000",
        "set server lane_r0/r0-jitter state ready",
        "set server lane_r1/r1 addr 10.1.0.9 port 5001",
        "set server lane_r1/r1-jitter state maint",
        "del server lane_r1/r1-jitter",
        "set server lane_r2/r2 state drain",
        "set server lane_r3/r3 state ready",
    ]
    mirrored = {
        "r0": {"r0": row("127.0.0.1", 5000, 1), "r0-jitter": row("127.0.0.1", 7000)},
        "r1": {"r1": row("10.1.0.9", 5001)},
        "r2": {"r2": row("127.0.0.1", 5002, 8)},
        "r3": {"r3": row("127.0.0.1", 5003)},
    }
    assert litellm.lane_commands(engines, mirrored) == []


def _lane_line(t: float, server: str, status: int, rid: str) -> str:
    return (
        f"{t:.3f} {server} {status} 0 0 5 200 1000 ---- 0 {{{rid}}} "
        '"POST /v1/chat/completions HTTP/1.1" 0 0 0'
    )


def test_figures_read_the_lanes_log_and_the_clients_records(tmp_path: Path) -> None:
    lab, drill = tmp_path / "lab", tmp_path / "drill"
    lab.mkdir()
    drill.mkdir()
    (lab / gateways.GATEWAY_FILE).write_text(
        json.dumps({"gateway": "litellm", "direct_first_token_gap_s": 0.0})
    )
    t0 = 1000.0
    recs = [  # a: ok; b: LiteLLM retried it on another lane; c: 503 after 2 s; d: timed out
        {"request_id": "a", "attempt": 1, "sent_at": t0, "end_at": t0 + 1, "status": 200,
         "ok": True, "error_class": None},
        {"request_id": "b", "attempt": 1, "sent_at": t0, "end_at": t0 + 3, "status": 200,
         "ok": True, "error_class": None},
        {"request_id": "c", "attempt": 1, "sent_at": t0, "end_at": t0 + 2, "status": 503,
         "ok": False, "error_class": "http_5xx"},
        {"request_id": "d", "attempt": 1, "sent_at": t0, "end_at": t0 + 10, "status": None,
         "ok": False, "error_class": "timeout_ttft"},
    ]  # fmt: skip
    (drill / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (lab / "haproxy-requests.log").write_text(
        "\n".join(
            [
                _lane_line(t0 + 0.01, "r0", 200, "a"),
                _lane_line(t0 + 0.01, "r1", 503, "b"),  # r1 is down: a try routed to it
                _lane_line(t0 + 0.02, "r2", 200, "b"),
                _lane_line(t0 + 0.01, "r1", 503, "c"),
                _lane_line(t0 + 0.01, "r2", 200, "d"),
                _lane_line(t0 + 0.01, "r0", 200, "someone-else"),
            ]
        )
        + "\n"
    )
    (lab / "events.jsonl").write_text(
        json.dumps({"t": t0 - 1, "replica": "r1", "event": "exit"}) + "\n"
    )
    (lab / "ledger.jsonl").write_text(
        "".join(
            json.dumps({"t": t0 + 0.02, "event": "generation", "replica": r, "request_id": rid})
            + "\n"
            for rid, r in (("a", "r0"), ("b", "r2"), ("d", "r2"))
        )
    )
    fig = gateway_figures(lab, drill)
    assert fig["gateway"] == "litellm"
    assert fig["gateway_retries"] == 1  # b: two lane tries in one client attempt
    assert fig["routed_to_down"] == 2  # b's and c's tries to r1 after its exit
    assert fig["gateway_timeout_s"] == 10.0  # d: held until the client gave up
    assert fig["gateway_gave_up"] == 2
    assert fig["retry_amplification"] == 1.0


def test_routed_replicas_name_the_lanes_the_model_list_reaches(tmp_path: Path) -> None:
    cfg = tmp_path / "litellm.yaml"
    cfg.write_text(litellm.render_config(None, LANES, ["r0", "r2"], 8801, "lab1"))
    assert litellm.routed_replicas(cfg, LANES) == ["r0", "r2"]  # not r1, not the standby r3
    assert litellm.routed_replicas(tmp_path / "missing.yaml", LANES) == []
