"""The drills through nginx with the user's config (issue 14), on the real lab.

One game day per config (the gateway is a lab's, so one lab each), one short drill each:
network-jitter with a client whose attempt timeout (8 s) sits above the slowest generation, so
the client alone re-runs no generation (it passes behind HAProxy: tests/test_verdict_lab.py).

- ``router-retries.conf`` (nginx re-sends a POST that timed out at the gateway to the next
  replica): FAILED with ``retry_amplification`` as a reason, more than one upstream generation
  per client attempt in the engine ledger;
- ``good.conf`` (its counterpart): PASSED, with the gateway figures measured and within their
  thresholds; the evidence names nginx and the config, scrubbed.

- ``idle-timeout.conf`` (``proxy_read_timeout 2s``) under the engine's stall mode (3 s pauses
  on one replica, ``experiments/tools/engine-fault.yaml``): FAILED with ``streams_cut_200``.

- HAProxy with the user's config (issue 23 item 2): upstream-timeout through
  ``examples/gateways/haproxy/weak.cfg`` (no ``timeout server``, slow checks): FAILED on hung
  requests and ``gateway_timeout_s``; the gateway figures checked against HAProxy's own request
  log and the fault's ground truth.

About 5 minutes here.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from labutil import run_gameday

from chaoslib_infer.lab.gateways.nginx import find_nginx
from chaoslib_infer.lab.haproxy import find_haproxy
from chaoslib_infer.verdict.blame import strip_blame

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "gateways" / "nginx"
pytestmark = [pytest.mark.lab]
needs_nginx = pytest.mark.skipif(
    find_nginx() is None, reason="nginx not installed (apt-get install nginx-light)"
)


def _gameday(
    tmp: Path, config: str, edits: dict[str, str] | None = None, drill: dict[str, Any] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    doc = yaml.safe_load((ROOT / "experiments" / "network-jitter.yaml").read_text())
    doc["controls"][0]["provider"]["arguments"]["attempt_timeout_s"] = 8.0
    exp = tmp / "exp" / "network-jitter.yaml"  # the file stem names the drill (its criteria)
    exp.parent.mkdir(parents=True, exist_ok=True)
    exp.write_text(yaml.safe_dump(doc))
    # a secret in the user's config must not reach the evidence
    cfg = tmp / f"{config}.conf"
    text = (EXAMPLES / f"{config}.conf").read_text()
    text = text.replace(
        "proxy_http_version 1.1;",
        'proxy_http_version 1.1;\n    proxy_set_header X-Api-Key "lab-secret-0123456789";',
        1,
    )
    for old, new in (edits or {}).items():
        assert old in text
        text = text.replace(old, new)
    cfg.write_text(text)
    plan = tmp / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "name": f"nginx-{config}",
                "lab": {
                    "replicas": 3,
                    "engine": "sim",
                    "engine_args": {"max_num_seqs": 4},
                    "gateway": "nginx",
                    "gateway_config": cfg.name,
                },
                "drills": [drill or {"name": "network-jitter", "experiment": str(exp)}],
            }
        )
    )
    out = tmp / "gd"
    proc, summary = run_gameday(plan, out, timeout_s=400)
    result = summary["drills"][0]
    name = summary["drills"][0]["name"]
    text = (out / name / "evidence.md").read_text() + json.dumps(summary)
    assert "lab-secret-0123456789" not in text
    gw = result["ground_truth"]["gateway"]
    assert gw["gateway"] == "nginx" and gw["config_path"] == str(cfg)
    assert "[REDACTED]" in gw["config"] and "proxy_read_timeout" in gw["config"]
    if drill is None:  # the jitter detour went through the intent plane into nginx's upstream
        sync = (out / "lab" / "gateway-sync.jsonl").read_text().splitlines()
        assert any("-jitter" in ln for ln in sync), sync
    return proc, result


@needs_nginx
def test_router_retries_fail_on_retry_amplification(tmp_path: Path) -> None:
    # 600 ms instead of the example's 1 s: the jittered replica's slow answers then pass the
    # gateway's timeout often enough in 20 s for the test to see a router retry every run
    edits = {"proxy_read_timeout 1s;": "proxy_read_timeout 600ms;"}
    proc, drill = _gameday(tmp_path, "router-retries", edits)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 1, tail
    assert drill["status"] == "failed", drill["reasons"]
    assert any(strip_blame(r).endswith("(retry_amplification)") for r in drill["reasons"]), drill[
        "reasons"
    ]
    fig = drill["figures"]
    assert fig["retry_amplification"] >= 2.0 and fig["gateway_retries"] >= 1
    rows = {r["criterion"]: r for r in drill["verdict"]["rows"]}
    assert rows["retry_amplification"]["result"] == "fail"


@needs_nginx
def test_good_config_passes_with_gateway_figures(tmp_path: Path) -> None:
    proc, drill = _gameday(tmp_path, "good")
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert drill["status"] == "passed", (drill["reasons"], tail)
    assert proc.returncode == 0, tail
    fig = drill["figures"]
    assert fig["gateway"] == "nginx" and fig["retry_amplification"] == 1.0
    assert fig["streams_cut_200"] == 0 and fig["stream_buffering_s"] is not None
    assert fig["stream_buffering_s"] <= 0.25 and fig["duplicates"] == 0
    rows = {r["criterion"]: r for r in drill["verdict"]["rows"]}
    for name in ("retry_amplification", "stream_buffering_s", "streams_cut_200"):
        assert rows[name]["result"] == "pass", rows[name]


@needs_nginx
def test_idle_timeout_below_a_pause_cuts_streams_after_a_200(tmp_path: Path) -> None:
    # the engine's stall mode pauses r1's streams for 3 s after 2 tokens (a long think or a
    # queue); idle-timeout.conf's proxy_read_timeout (2 s) cuts them after nginx answered 200
    stall = {
        "name": "engine-stall",
        "experiment": str(ROOT / "experiments" / "tools" / "engine-fault.yaml"),
        "vars": {
            "engine_fault_mode": "stall",
            "engine_fault_replica": "r1",
            "engine_fault_params": "k=2;t=3",
            "hold_s": 10,
            "load_rate_rps": 10,
        },
    }
    proc, drill = _gameday(tmp_path, "idle-timeout", drill=stall)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert drill["status"] == "failed", drill["reasons"]
    assert any(strip_blame(r).endswith("(streams_cut_200)") for r in drill["reasons"]), drill[
        "reasons"
    ]
    assert drill["figures"]["streams_cut_200"] >= 1


_HAPROXY_LINE = re.compile(  # the lab's LOG_FORMAT, read again here (not through the parser)
    r"^(?P<t>[\d.]+) (?P<srv>\S+) (?P<st>-?\d+) (?P<tw>-?\d+) (?P<tc>-?\d+) -?\d+ (?P<ta>\d+) "
    r"\d+ (?P<tsc>\S+) (?P<rc>\S+) \{(?P<rid>[^}]*)\} \"[^\"]*\" "
    r"(?P<th>\d+) (?P<ti>\d+) (?P<trq>\d+)$"
)


@pytest.mark.slow
@pytest.mark.skipif(find_haproxy() is None, reason="haproxy not installed")
def test_haproxy_with_your_config_upstream_timeout_gateway_figures(tmp_path: Path) -> None:
    """weak.cfg has no ``timeout server``: HAProxy holds the requests sent to the frozen replica
    until the client gives up (and past it: without ``option abortonclose`` it notices the
    client only when the thawed replica answers). The figures against HAProxy's own log."""
    cfg = tmp_path / "weak.cfg"
    text = (ROOT / "examples" / "gateways" / "haproxy" / "weak.cfg").read_text()
    secret = "    http-request set-header X-Api-Key lab-secret-0123456789\n"  # scrubbed
    assert "    balance roundrobin\n" in text
    cfg.write_text(text.replace("    balance roundrobin\n", "    balance roundrobin\n" + secret))
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "name": "haproxy-weak",
                "lab": {
                    "replicas": 3,
                    "engine": "sim",
                    "engine_args": {"max_num_seqs": 4},
                    "gateway": "haproxy",
                    "gateway_config": cfg.name,
                },
                "drills": [
                    {
                        "name": "upstream-timeout",
                        "experiment": str(ROOT / "experiments" / "upstream-timeout.yaml"),
                    }
                ],
            }
        )
    )
    out = tmp_path / "gd"
    proc, summary = run_gameday(plan, out, timeout_s=400)
    drill = summary["drills"][0]
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 1 and drill["status"] == "failed", (drill.get("reasons"), tail)
    fig = drill["figures"]
    assert fig["gateway"] == "haproxy" and fig["hung_requests"] >= 1
    assert any(strip_blame(r).endswith("(gateway_timeout_s)") for r in drill["reasons"]), drill[
        "reasons"
    ]
    gw = drill["ground_truth"]["gateway"]
    assert gw["config_path"] == str(cfg) and "[REDACTED]" in gw["config"]
    assert "lab-secret-0123456789" not in json.dumps(summary)
    assert gw["version"].startswith("HAProxy version")
    lab_cfg = (out / "lab" / "haproxy.cfg").read_text()  # the lab's lines, injected
    assert f"stats socket {(out / 'lab').resolve()}/haproxy.sock" in lab_cfg
    assert "capture request header X-Request-Id len 64" in lab_cfg

    records = [json.loads(ln) for ln in (out / "upstream-timeout" / "records.jsonl").open()]
    rids = {r["request_id"] for r in records if r.get("sent_at")}
    fault = json.loads((out / "upstream-timeout" / "faults.jsonl").read_text().splitlines()[0])
    t0, t1 = fault["fault_at"], fault["fault_at"] + fault["hold_s"]
    held, to_frozen = [], 0
    for ln in (out / "lab" / "haproxy-requests.log").read_text().splitlines():
        m = _HAPROXY_LINE.match(ln)
        if not m or m["rid"] not in rids:
            continue
        assert m["rc"] == "0"  # weak.cfg retries nothing
        if int(m["st"]) >= 500 or m["tsc"][0] in "Cs":
            held.append(int(m["ta"]) / 1000)
        fwd = float(m["t"]) + sum(int(m[k]) for k in ("th", "ti", "trq", "tw", "tc")) / 1000
        to_frozen += m["srv"] == fault["replica"] and t0 <= fwd <= t1
    assert fig["gateway_timeout_s"] == pytest.approx(max(held), abs=1e-3)
    assert fig["gateway_timeout_s"] > 5.0
    # HAProxy held each hung request at least as long as its client waited
    waits = [
        r["end_at"] - r["sent_at"]
        for r in records
        if str(r.get("error_class")).startswith("timeout")
    ]
    assert fig["gateway_timeout_s"] >= max(waits) - 0.05
    # sent to the frozen replica while frozen (a stream already on it when it froze is not)
    assert fig["routed_to_down"] == to_frozen >= 1
    assert fig["retry_amplification"] == 1.0 and fig["gateway_retries"] == 0
    assert fig["streams_cut_200"] == 0 and fig["stream_buffering_s"] is not None
