"""Provider certification: profiles, mimic engines, ranking, side-by-side report, key scrubbing.

Engines are lab sim engines on loopback (``--profile`` mimic mode); plans are scaled down to a
few requests per phase (``--quick`` or a tiny plan file): conformance and ranking, not load.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from chaoslib_infer.certify import certify_command, load_plan
from chaoslib_infer.errors import ConfigError
from chaoslib_infer.load.records import read_records
from chaoslib_infer.measure.figures import duplicates
from chaoslib_infer.platforms.endpoint import load_target
from chaoslib_infer.providers import PROFILES, endpoint, error_kind, get_profile, parse_error

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "chaoslib_infer.cli"]
KEY = "sk-cert-test-6f1d2c9a8b7e"


@contextmanager
def engines(*specs: tuple[tuple[str, ...], str | None]) -> Iterator[list[int]]:
    """Sim engines on free loopback ports, started together; yields their ports once each
    answers HTTP. ``specs``: ``(engine args, key or None)`` per engine."""
    procs = []
    try:
        for args, key in specs:
            env = dict(os.environ)
            env.pop("CHAOS_INFER_ENGINE_API_KEY", None)
            if key:
                env["CHAOS_INFER_ENGINE_API_KEY"] = key
            cmd = [sys.executable, "-m", "chaoslib_infer.lab.engine", "--port", "0",
                   "--load-delay-s", "0", "--warmup-requests", "0", "--prefill-s-per-token", "0",
                   *args]  # fmt: skip
            procs.append(subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          text=True, env=env))  # fmt: skip
        ports = []
        for proc in procs:
            assert proc.stderr is not None
            m = re.search(r"port=(\d+)", proc.stderr.readline())
            assert m, "engine did not start"
            ports.append(int(m.group(1)))
        deadline = time.monotonic() + 15
        for port in ports:
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/faults", timeout=1)
                    break
                except urllib.error.HTTPError:
                    break
                except OSError:
                    assert time.monotonic() < deadline, "engine not answering"
                    time.sleep(0.05)
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def engine(*args: str, key: str | None = None) -> Iterator[int]:
    """One sim engine (see :func:`engines`); yields its port."""
    with engines((args, key)) as ports:
        yield ports[0]


def write_target(path: Path, **fields: object) -> Path:
    path.write_text(yaml.safe_dump(fields))
    return path


def tiny_plan(path: Path, **phases: dict[str, object]) -> Path:
    """A plan with only ``phases`` enabled (with their overrides)."""
    doc: dict[str, object] = {
        "request": {"max_tokens": 8},
        "slo": {"p95_over_p50": None},
        "recovery": {"window_s": 0.5, "settle_s": 1.0},
        "phases": {
            name: ({"enabled": True, **phases[name]} if name in phases else {"enabled": False})
            for name in ("single", "ramp", "burst", "soak", "jitter", "timeouts")
        },
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def no_key_anywhere(out: Path, key: str) -> None:
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files
    for p in files:
        assert key.encode() not in p.read_bytes(), f"key written to {p}"


# --------------------------------------------------------------------------- profiles (unit)


def test_error_shapes_of_each_provider() -> None:
    vllm = {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}}
    assert parse_error(json.dumps(vllm)) == {"shape": "openai", "message": "bad",
                                             "type": "BadRequestError", "code": "400"}  # fmt: skip
    assert parse_error(b'{"error": "Unauthorized"}')["message"] == "Unauthorized"
    flat = {
        "object": "error",
        "message": "m",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    assert parse_error(flat)["shape"] == "flat"
    tgi = parse_error('{"error": "Input validation error", "error_type": "validation"}')
    assert (tgi["shape"], tgi["type"]) == ("tgi", "validation")
    assert parse_error('{"detail": "Unknown model: x"}') == {
        "shape": "detail", "message": "Unknown model: x", "type": None, "code": None}  # fmt: skip
    ark = {"error": {"code": "RateLimitExceeded.EndpointRPMExceeded", "message": "RPM",
                     "param": "", "type": "TooManyRequests"}}  # fmt: skip
    assert parse_error(ark)["code"] == "RateLimitExceeded.EndpointRPMExceeded"
    assert parse_error(b"")["shape"] == "empty" and parse_error("oops")["shape"] == "text"
    tgi_p, ark_p, vllm_p = get_profile("tgi"), get_profile("ARK"), get_profile("vllm")
    assert error_kind(tgi_p, 424, "http_4xx") == "server"  # TGI's generation error
    assert error_kind(tgi_p, 422, "http_4xx") == "validation"
    assert error_kind(ark_p, 429, "http_429") == "rate_limit"
    assert error_kind(vllm_p, 429, "http_429") == "overload"
    assert error_kind(vllm_p, 401, "http_4xx") == "auth"
    assert error_kind(vllm_p, None, "timeout_idle") == "timeout"
    assert error_kind(vllm_p, None, "reset") == "transport"
    assert error_kind(vllm_p, 200, None) == "ok"
    assert endpoint(ark_p, "https://ark.cn-beijing.volces.com/api/v3/") == (
        "https://ark.cn-beijing.volces.com/api/v3/chat/completions")  # fmt: skip
    assert endpoint(vllm_p, "http://h:8000/v1") == endpoint(vllm_p, "http://h:8000")
    assert set(PROFILES) == {"vllm", "sglang", "tgi", "trtllm", "ark", "openai"}
    with pytest.raises(KeyError):
        get_profile("bedrock")


def test_plan_defaults_quick_scale_and_refusals(tmp_path: Path) -> None:
    full = load_plan()
    assert full.phases["ramp"]["concurrency"] == [8, 32, 64] and not full.quick
    quick = load_plan(quick=True)
    assert quick.phases["single"]["requests"] == 10 and quick.request["max_tokens"] == 8
    assert quick.slo.p95_over_p50 is None and quick.slo.p99_e2e_s == 10.0
    twice = load_plan(quick=True, scale=2.0, soak_s=7.0)
    assert twice.phases["burst"]["burst_s"] == 2 * quick.phases["burst"]["burst_s"]
    assert twice.phases["single"]["requests"] == 20 and twice.phases["soak"]["duration_s"] == 7.0
    for doc, needle in (
        ({"phases": {"ramp": {"concurency": [1]}}}, "unknown key 'concurency'"),
        ({"phases": {"ramp": {"concurrency": []}}}, "list of integers"),
        ({"phases": {"jitter": {"distribution": "pareto"}}}, "normal or uniform"),
        ({"phases": {"soak": {"mix": "huge:1"}}}, "unknown mix class"),
        ({"slo": {"p99_e2e_s": -1}}, "number > 0"),
        ({"bogus": 1}, "unknown key 'bogus'"),
    ):
        p = tmp_path / "plan.yaml"
        p.write_text(yaml.safe_dump(doc))
        with pytest.raises(ConfigError, match=needle):
            load_plan(p)
    with pytest.raises(ConfigError, match="--scale"):
        load_plan(scale=0)


# --------------------------------------------------------------------------- bad input


def test_bad_target_files_exit_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CERT_NO_SUCH_KEY", raising=False)
    monkeypatch.setenv("CERT_SHORT_KEY", "abc")
    ok = {"profile": "vllm", "url": "http://127.0.0.1:9", "model": "m"}
    cases = [
        (None, "cannot read target file"),
        ("not: [valid", "not valid YAML"),
        ({**ok, "api_key": KEY}, "never put the key in the target file"),
        ({**ok, "profile": "bedrock"}, "unknown profile 'bedrock'"),
        ({**ok, "color": "red"}, "unknown field 'color'"),
        ({**ok, "api_key_env": "CERT_NO_SUCH_KEY"}, "$CERT_NO_SUCH_KEY is not set"),
        ({**ok, "api_key_env": "CERT_SHORT_KEY"}, "$CERT_SHORT_KEY is not set"),
        ({**ok, "url": "https://api.example.com"}, "outside the allowlist"),
        ({k: v for k, v in ok.items() if k != "model"}, "missing required field 'model'"),
        ({**ok, "price": {"input_per_1m": -1}}, "price.input_per_1m"),
        ({**ok, "name": "a b"}, "name: expected letters"),
    ]
    for i, (doc, needle) in enumerate(cases):
        path = tmp_path / f"t{i}.yaml"
        if doc is not None:
            path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
        lines: list[str] = []
        code = certify_command([path], tmp_path / "out", echo=lines.append, err=lines.append)
        assert code == 2, (needle, lines)
        assert len(lines) == 1 and lines[0].startswith("chaos-infer: error: "), lines
        assert needle in lines[0] and KEY not in lines[0], (needle, lines)
        assert str(path) in lines[0]
    a = write_target(tmp_path / "a.yaml", **ok, name="same")
    lines = []
    assert certify_command([a, a], tmp_path / "out", echo=lines.append, err=lines.append) == 2
    assert "named 'same'" in lines[0]
    assert not (tmp_path / "out").exists()  # refused before anything started
    # the CLI itself: one line on stderr, no traceback
    bad = write_target(tmp_path / "bad.yaml", **{**ok, "api_key": KEY})
    p = subprocess.run([*CLI, "certify", "--target", str(bad), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert KEY not in p.stderr + p.stdout


def test_unreachable_target_exit_2_and_dry_run(tmp_path: Path) -> None:
    t = write_target(tmp_path / "gone.yaml", profile="openai", url="http://127.0.0.1:9", model="m")
    lines: list[str] = []
    assert certify_command([t], tmp_path / "dry", dry_run=True, echo=lines.append,
                           err=lines.append) == 0  # fmt: skip
    assert lines[-1] == "dry run: no request was sent" and not (tmp_path / "dry").exists()
    assert any(line.startswith("target gone: Generic OpenAI") for line in lines)
    lines = []
    code = certify_command([t], tmp_path / "out", quick=True, echo=lines.append, err=lines.append)
    assert code == 2
    errs = [line for line in lines if line.startswith("chaos-infer: error:")]
    assert len(errs) == 1 and "target gone" in errs[0] and "127.0.0.1:9" in errs[0]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["complete"] is False and "target gone" in summary["error"]


# --------------------------------------------------------------------------- mimic engines


def test_six_profiles_conform_and_certify_side_by_side(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Each profile's mimic answers like its profile; a few requests each, one report."""
    monkeypatch.setenv("CERT_KEY", KEY)
    model = "ep-20250101-cert"
    specs = [(("--profile", name, "--model", model, "--itl-s", "0.002", "--output-tokens", "8"),
              KEY) for name in PROFILES]  # fmt: skip
    with engines(*specs) as started:
        ports = dict(zip(PROFILES, started, strict=True))
        # a target that declares the wrong profile: conformance must say so
        ports["tgi-as-vllm"] = ports["tgi"]
        files = []
        for name, port in ports.items():
            prof = "vllm" if name == "tgi-as-vllm" else name
            url = f"http://127.0.0.1:{port}" + ("/api/v3" if prof == "ark" else "")
            files.append(write_target(tmp_path / f"{name}.yaml", name=name, profile=prof,
                                      url=url, model=model, api_key_env="CERT_KEY"))  # fmt: skip
        plan = tiny_plan(tmp_path / "plan.yaml", single={"requests": 3})
        out = tmp_path / "out"
        lines: list[str] = []
        code = certify_command(files, out, plan_path=plan, echo=lines.append, err=lines.append)
    summary = json.loads((out / "summary.json").read_text())
    by = {t["name"]: t for t in summary["targets"]}
    assert code == 0, lines
    assert set(by) == set(PROFILES) | {"tgi-as-vllm"}
    for name in PROFILES:
        t = by[name]
        rows = {r["check"]: r for r in t["probe"]["rows"]}
        assert t["probe"]["conformant"] and t["probe"]["usable"], (name, rows)
        assert rows["first chat chunk"]["observed"] == PROFILES[name].role_chunk
        assert rows["usage in stream"]["passed"] is True
        assert rows["error body shape"]["passed"] is True, rows["error body shape"]
        assert ("key enforced" in rows) == (PROFILES[name].unauthorized is not None)
        assert all(rows[f"health {h}"]["passed"] for h in PROFILES[name].health_paths)
        assert t["verdict"] == "CERTIFIED", (name, t["reasons"])
        recs = read_records(out / name / "single" / "records.jsonl")
        assert len(recs) == 3 and all(r["ok"] and r["tokens_source"] == "usage" for r in recs)
        assert t["probe"]["input_tokens"]["per_word"] > 0
    assert by["ark"]["target"]["chat_url"].endswith("/api/v3/chat/completions")
    wrong = {r["check"]: r for r in by["tgi-as-vllm"]["probe"]["rows"]}
    assert (
        wrong["error body shape"]["passed"] is False
        and "tgi" in wrong["error body shape"]["observed"]
    )
    assert wrong["first chat chunk"]["passed"] is False
    assert not by["tgi-as-vllm"]["probe"]["conformant"] and by["tgi-as-vllm"]["probe"]["usable"]
    html = (out / "report.html").read_text()
    for name in by:
        assert f'<th class="t">{name} — PASS' in html
    # one engine behind every mimic, 3 requests each: the ranking must not order them on noise
    # (issue 21 item 6): P99s carry bootstrap intervals that overlap, so they tie
    for t in by.values():
        p99 = next(
            r for r in t["scorecard"]["tiers"][0]["rows"] if r["metric"] == "P99 E2E latency"
        )
        assert p99["ci"]["n"] == 3 and p99["ci"]["lo"] <= p99["value"] <= p99["ci"]["hi"]
    tied = [t for t in summary["targets"] if t["tie"]]
    assert len(tied) >= 2 and all(t["rank"] == tied[0]["rank"] for t in tied[:2]), [
        (t["name"], t["rank"], t["ranking_note"]) for t in summary["targets"]
    ]
    notes = " ".join(n for t in summary["targets"] for n in t["ranking_note"])
    assert "tie on P99 E2E latency" in notes and "requests per target" in notes, notes
    md = (out / "report.md").read_text()
    assert f"| {tied[0]['rank']} (tie) |" in md and "95 % confidence interval" in md
    no_key_anywhere(out, KEY)
    assert all(KEY not in line for line in lines)


@pytest.mark.slow  # ~35 s: out of the fast tier
def test_certify_ranks_the_sturdy_target_first(tmp_path: Path) -> None:
    """Two differently configured lab engines: the sturdy one ranks first, side by side."""
    env = {**os.environ, "STURDY_KEY": KEY}
    ledger_s, ledger_f = tmp_path / "sturdy-ledger.jsonl", tmp_path / "fragile-ledger.jsonl"
    with engines(
        (("--profile", "tgi", "--itl-s", "0.004", "--output-tokens", "8", "--max-num-seqs", "64",
          "--max-waiting", "256", "--ledger", str(ledger_s)), KEY),
        (("--profile", "vllm", "--itl-s", "0.004", "--output-tokens", "8", "--max-num-seqs", "2",
          "--max-waiting", "0", "--queue-full-status", "503", "--ledger", str(ledger_f)), None),
    ) as (ps, pf):  # fmt: skip
        sturdy = write_target(tmp_path / "sturdy.yaml", name="sturdy", profile="tgi",
                              url=f"http://127.0.0.1:{ps}", model="tgi", api_key_env="STURDY_KEY",
                              price={"input_per_1m": 1.0, "output_per_1m": 4.0})  # fmt: skip
        fragile = write_target(tmp_path / "fragile.yaml", name="fragile", profile="vllm",
                               url=f"http://127.0.0.1:{pf}/v1", model="chaos-sim")  # fmt: skip
        out = tmp_path / "out"
        p = subprocess.run(
            [*CLI, "certify", "--target", str(fragile), "--target", str(sturdy), "--quick",
             "--out", str(out)], capture_output=True, text=True, timeout=240, cwd=ROOT, env=env,
        )  # fmt: skip
    assert p.returncode == 1, p.stdout + p.stderr  # the fragile one is not certified
    assert KEY not in p.stdout + p.stderr and "Traceback" not in p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["ranking"] == ["sturdy", "fragile"]
    by = {t["name"]: t for t in summary["targets"]}
    assert by["sturdy"]["verdict"] == "CERTIFIED", by["sturdy"]["reasons"]
    assert by["fragile"]["verdict"] == "NOT CERTIFIED"
    assert any(r.startswith("error rate (steady state)") for r in by["fragile"]["reasons"])
    assert [t["rank"] for t in summary["targets"]] == [1, 2]
    # side by side: one column per target in every table, the console table too
    html = (out / "report.html").read_text()
    assert '<th class="t">sturdy — PASS' in html and '<th class="t">fragile — FAIL' in html
    assert html.count("data:image/png;base64,") >= 4 and 'src="http' not in html
    md = (out / "report.md").read_text()
    assert "| metric | reference | sturdy (PASS) | fragile (FAIL) |" in md
    head = next(line for line in p.stdout.splitlines() if line.startswith(" " * 32)).split()
    assert head == ["sturdy", "fragile"] and "CERTIFIED" in p.stdout
    # figures against ground truth: the engines' own generation ledgers
    for name, ledger in (("sturdy", ledger_s), ("fragile", ledger_f)):
        t = by[name]
        recs = [r for ph in t["phases"] for r in read_records(out / name / ph["records"])]
        gens = [json.loads(x) for x in ledger.read_text().splitlines()]
        ids = {r["request_id"] for r in recs}
        served = [g for g in gens if g.get("event") == "generation" and g["request_id"] in ids]
        # every attempt the engine started is one that got a 200; refused (503) ones never started
        assert len(served) == sum(1 for r in recs if r["status"] == 200)
        dups = sum(ph["figures"].get("possible_duplicates") or 0 for ph in t["phases"])
        assert duplicates(recs, gens) <= dups
    f_phases = {ph["name"]: ph for ph in by["fragile"]["phases"]}
    refused = sum(1 for r in read_records(out / "fragile" / "burst" / "records.jsonl")
                  if r["status"] == 503)  # fmt: skip
    assert (
        f_phases["burst"]["figures"]["shed_requests"] > 0
        and refused >= f_phases["burst"]["figures"]["shed_requests"]
    )
    # the jitter we injected in our own transport, and what it did
    jit = {ph["name"]: ph for ph in by["sturdy"]["phases"]}["jitter"]
    gt = jit["ground_truth"]
    assert gt["downlink"]["n"] > 0 and 0.08 <= gt["downlink"]["mean_s"] <= 0.3
    assert gt["uplink"]["n"] > 0 and abs(gt["uplink"]["mean_s"] - 0.1) < 0.05
    assert jit["figures"]["jitter_p99_e2e_s"] > jit["figures"]["baseline_p99_e2e_s"] + 0.05
    # cost per request from the price and the target's own token counts
    cost = next(
        r
        for r in by["sturdy"]["scorecard"]["tiers"][1]["rows"]
        if r["metric"] == "cost per request"
    )
    assert cost["value"] and cost["value"] > 0 and "input" in cost["note"]
    no_key_anywhere(out, KEY)


def test_client_timeouts_count_duplicates_against_the_ledger(tmp_path: Path) -> None:
    """Stalled streams cut by our timeout and retried: possible duplicates vs the exact ledger."""
    ledger = tmp_path / "ledger.jsonl"
    with engine("--profile", "vllm", "--itl-s", "0.002", "--output-tokens", "8", "--ledger",
                str(ledger)) as port:  # fmt: skip
        fault = {"mode": "stall", "k": 1, "t": 1.2, "probability": 0.5, "seed": 7}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/admin/faults",
                                     data=json.dumps(fault).encode(), method="POST")  # fmt: skip
        urllib.request.urlopen(req, timeout=5).read()
        t = write_target(tmp_path / "t.yaml", name="stally", profile="vllm",
                         url=f"http://127.0.0.1:{port}", model="m")  # fmt: skip
        plan = tiny_plan(tmp_path / "plan.yaml", timeouts={
            "rate_rps": 10, "duration_s": 2.0, "attempt_timeout_s": 0.4, "retry_attempts": 2,
            "backoff_s": 0.05})  # fmt: skip
        lines: list[str] = []
        certify_command([t], tmp_path / "out", plan_path=plan, echo=lines.append, err=lines.append)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    ph = summary["targets"][0]["phases"][0]
    f = ph["figures"]
    recs = read_records(tmp_path / "out" / "stally" / "timeouts" / "records.jsonl")
    gens = [json.loads(x) for x in ledger.read_text().splitlines()]
    exact = duplicates(recs, gens)
    assert f["timed_out_attempts"] > 0 and f["retries"] > 0 and f["retry_amplification"] > 1
    assert exact >= 1 and exact == f["possible_duplicates"], (exact, f)
    assert f["timed_out_attempts"] == sum(
        1 for r in recs if str(r["error_class"]).startswith("timeout_")
    )


def test_target_key_sources_never_expose_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "key").write_text(KEY + "\n")
    t = load_target(write_target(tmp_path / "ark.yaml", profile="ark", model="ep-1",
                                 api_key_file="key"), allow=("https://ark.cn-beijing.volces.com:443",))  # fmt: skip
    assert t.url == "https://ark.cn-beijing.volces.com/api/v3"  # the profile's default base URL
    assert t.chat_url == "https://ark.cn-beijing.volces.com/api/v3/chat/completions"
    assert t.headers() == {"Authorization": f"Bearer {KEY}"}
    assert KEY not in repr(t) and KEY not in json.dumps(t.describe())
    assert t.describe()["auth"].endswith(f"<key from file {tmp_path / 'key'}>")
    monkeypatch.setenv("CERT_ENV_KEY", KEY)
    t2 = load_target(write_target(tmp_path / "v.yaml", profile="tgi", url="http://127.0.0.1:1",
                                  model="m", api_key_env="CERT_ENV_KEY", include_usage=False))  # fmt: skip
    assert t2.key == KEY and t2.key_source == "$CERT_ENV_KEY" and not t2.include_usage
    with pytest.raises(ConfigError, match="outside the allowlist"):
        load_target(tmp_path / "ark.yaml")  # no --allow: a public host is refused
