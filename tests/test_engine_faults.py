"""Engine fault modes (issue 3): each mode, armed through the admin endpoint and per request by
header, is caught by the right probe.

Real engine subprocesses on 127.0.0.1 (a reset needs a real socket, a crash a real process), driven
by the project's load client (``send_attempt`` / ``run_load``); ground truth is the engine's own
ledger (``"event": "fault"`` lines).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chaoslib.exceptions import ActivityFailed
from labutil import engine_argv

from chaoslib_infer.activities import engine_faults as ef
from chaoslib_infer.activities.health import health_disagreement_check
from chaoslib_infer.activities.slo import slo_check
from chaoslib_infer.evidence.figures import DrillContext, read_jsonl
from chaoslib_infer.evidence.kinds import engine_fault as ev
from chaoslib_infer.lab.engine import (
    CRASH_EXIT_CODE,
    FAULT_PARAMS,
    EngineConfig,
    RequestError,
    build_app,
    parse_fault,
    parse_fault_header,
)
from chaoslib_infer.lab.fleet import Lab
from chaoslib_infer.load.client import LoadSpec, build_body, make_session, run_load, send_attempt
from chaoslib_infer.load.records import RecordWriter, read_records
from chaoslib_infer.measure.health import health_disagreement, replica_of_requests
from chaoslib_infer.measure.metrics import window_stats

ITL_S = 0.01


# ---------------------------------------------------------------------------- helpers


class Engine:
    """A real engine subprocess on 127.0.0.1 (port 0) with its own ledger."""

    def __init__(self, ledger: Path, replica: str = "f0", *extra: str) -> None:
        self.ledger = ledger
        self.replica = replica
        self.log = ledger.with_name(f"{replica}.log")
        self._log_fh = self.log.open("w")
        self.proc = subprocess.Popen(
            engine_argv(
                replica,
                ledger,
                "--load-delay-s",
                "0",
                "--warmup-requests",
                "0",
                "--itl-s",
                str(ITL_S),
                "--prefill-s-per-token",
                "0",
                *extra,
            ),  # fmt: skip
            stderr=self._log_fh,
        )
        deadline = time.monotonic() + 15
        while not (m := re.search(r"port=(\d+)", self.log.read_text())):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.02)
        self.port = int(m.group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 15
        while self.health() != 200:
            assert time.monotonic() < deadline, "engine never became healthy"
            time.sleep(0.02)

    def health(self) -> int | None:
        try:
            return httpx.get(self.url + "/health", timeout=1).status_code
        except httpx.TransportError:
            return None

    def admin(self, method: str, **kw: Any) -> httpx.Response:
        return httpx.request(method, self.url + "/admin/faults", timeout=3, **kw)

    def fault_lines(self, ids: set[str] | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in read_jsonl(self.ledger)
            if e.get("event") == "fault" and (ids is None or e.get("request_id") in ids)
        ]

    def errors_logged(self) -> list[str]:
        """Log lines that look like errors (an injected fault must not log as a crash)."""
        return [
            ln
            for ln in self.log.read_text().splitlines()
            if "Traceback" in ln or "ERROR" in ln or "Exception" in ln or "ASGI" in ln
        ]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self._log_fh.close()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    eng = Engine(tmp_path_factory.mktemp("faults") / "ledger.jsonl")
    try:
        yield eng
    finally:
        eng.stop()


@pytest.fixture
def clean(engine: Engine) -> Iterator[Engine]:
    """The shared engine with no fault armed before and after the test."""
    assert engine.admin("DELETE").status_code == 200
    yield engine
    assert engine.admin("DELETE").status_code == 200


def spec_for(url: str, header: str | None = None, **kw: Any) -> LoadSpec:
    base: dict[str, Any] = {
        "url": url,
        "max_tokens": 8,
        "ttft_timeout_s": 3.0,  # generous: attempts that must succeed on a busy 2-core box
        "idle_timeout_s": 2.0,
        "timeout_s": 5.0,
    }
    base.update(kw)
    if header is not None:
        base["headers"] = {"X-Chaos-Fault": header}
    return LoadSpec(**base)


def attempts(spec: LoadSpec, n: int, body: bytes | None = None) -> list[dict[str, Any]]:
    """``n`` concurrent attempts with the load client; returns their records."""

    async def main() -> list[dict[str, Any]]:
        async with make_session(spec) as session:
            rng = random.Random(0)
            jobs = [
                send_attempt(
                    session,
                    spec,
                    body if body is not None else json.dumps(build_body(spec, rng)).encode(),
                    str(uuid.uuid4()),
                )
                for _ in range(n)
            ]
            return list(await asyncio.gather(*jobs))

    return asyncio.run(main())


# ---------------------------------------------------------------------------- parsing / admin API


def test_fault_header_parsing() -> None:
    f = parse_fault_header("stall;k=3;t=2")
    assert (f.mode, f.params, f.probability, f.source) == (
        "stall",
        {"k": 3, "t": 2.0},
        1.0,
        "header",
    )
    f = parse_fault_header("  Stall ; K = 5 ;; T=0.25 ; ")
    assert f.params == {"k": 5, "t": 0.25}
    assert parse_fault_header("reset-after-k").params == {"k": 3}  # defaults, dash for underscore
    assert parse_fault_header("mode=hang;p=0.25").probability == 0.25
    assert parse_fault_header('garbled;how="BYTES";k=0').params == {"k": 0, "how": "bytes"}
    assert parse_fault_header("crash_on_long_prompt;n=10;how=kill").params == {
        "n": 10,
        "how": "kill",
    }
    bad = [
        "", " ; ", "bogus", "stall;k", "stall;k=", "stall;k=x", "stall;k=-1", "stall;k=1.5",
        "stall;k=1;k=2", "stall;t=nan", "stall;t=inf", "hang;p=2", "hang;ttl_s=3",
        "garbled;how=nope", "hang;k=1", "empty;factor=1",
    ]  # fmt: skip
    for value in bad:
        with pytest.raises(RequestError) as exc:
            parse_fault_header(value)
        assert exc.value.status == 400, value
    # admin JSON form: flat or nested params, ttl_s allowed, strict types
    f = parse_fault({"mode": "slowdown", "params": {"factor": 2}, "ttl_s": 5, "probability": 0.5})
    assert (f.params, f.ttl_s, f.probability) == ({"factor": 2.0}, 5.0, 0.5)
    for body in (
        {"mode": "stall", "k": True},
        {"mode": "stall", "k": "3"},
        {"mode": "stall", "k": 1, "params": {"k": 2}},
        {"mode": "hang", "ttl_s": 0},
        {"k": 3},
        {"mode": 3},
    ):
        with pytest.raises(RequestError):
            parse_fault(body)
    assert set(FAULT_PARAMS) == set(ef.FAULT_MODES)


def test_admin_api_in_process() -> None:
    async def main() -> None:
        app = build_app(EngineConfig(load_delay_s=0.0, warmup_requests=0, itl_s=0.0))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://e") as c:
            r = await c.get("/admin/faults")
            assert r.status_code == 200 and r.json()["faults"] == []
            assert "crash_on_long_prompt" in r.json()["modes"]
            r = await c.post(
                "/admin/faults", json={"mode": "stall", "k": 2, "t": 0.5, "probability": 0.5}
            )
            assert r.status_code == 200, r.text
            assert r.json()["fault"]["k"] == 2 and r.json()["fault"]["probability"] == 0.5
            await c.post("/admin/faults", json={"mode": "empty", "ttl_s": 0.05})
            r = await c.post("/admin/faults", json={"mode": "stall", "k": 4})  # replaces stall
            modes = [
                (f["mode"], f.get("k")) for f in (await c.get("/admin/faults")).json()["faults"]
            ]
            assert modes == [("empty", None), ("stall", 4)]
            await asyncio.sleep(0.1)  # the empty fault's ttl ran out
            assert [f["mode"] for f in (await c.get("/admin/faults")).json()["faults"]] == ["stall"]
            for body in (b"{", b'{"mode": "nope"}', b'{"mode": "stall", "k": -1}', b"[1]"):
                r = await c.post("/admin/faults", content=body)
                assert r.status_code == 400 and r.json()["error"]["message"], body
            assert (await c.delete("/admin/faults?mode=bogus")).status_code == 400
            r = await c.delete("/admin/faults?mode=stall")
            assert [f["mode"] for f in r.json()["cleared"]] == ["stall"]
            assert (await c.delete("/admin/faults")).json()["cleared"] == []  # idempotent
            # an unknown header mode is a 400 with an OpenAI error object; health is untouched
            body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
            r = await c.post("/v1/chat/completions", json=body, headers={"X-Chaos-Fault": "nope"})
            assert r.status_code == 400 and "unknown fault mode" in r.json()["error"]["message"]
            await c.post("/admin/faults", json={"mode": "hang"})
            assert (await c.get("/health")).status_code == 200
        # lab-only: a non-loopback peer gets 403
        far = httpx.ASGITransport(app=app, client=("10.1.2.3", 5555))
        async with httpx.AsyncClient(transport=far, base_url="http://e") as c:
            assert (await c.get("/admin/faults")).status_code == 403
            assert (await c.post("/admin/faults", json={"mode": "hang"})).status_code == 403
        # switched off: 404, and the header is ignored
        off = build_app(EngineConfig(load_delay_s=0.0, warmup_requests=0, admin_faults=False))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=off), base_url="http://e"
        ) as c:
            assert (await c.get("/admin/faults")).status_code == 404
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            r = await c.post("/v1/chat/completions", json=body, headers={"X-Chaos-Fault": "empty"})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]

    asyncio.run(main())


# ---------------------------------------------------------------------------- each mode, caught

#: Client timeouts for sabotaged attempts: a hang shows as timeout_ttft after 0.5 s, a 1 s stall
#: as timeout_idle after 0.3 s.
FAST: dict[str, Any] = {"ttft_timeout_s": 0.5, "idle_timeout_s": 0.3}

# (mode, params, expected error class, output chunks the client sees before the failure)
CASES = [
    ("hang", {}, "timeout_ttft", 0),
    ("reset_after_k", {"k": 3}, "reset", 3),
    ("stall", {"k": 2, "t": 1.0}, "timeout_idle", 2),
    ("error_in_stream", {"k": 1}, "stream_error", 1),
    ("empty", {}, "empty", 0),
    ("garbled", {"how": "both"}, "garbled", 8),
    ("garbled", {"how": "bytes", "k": 0}, "garbled", 8),
    ("garbled", {"how": "fffd", "k": 5}, "garbled", 8),
    ("truncated", {"k": 3}, "truncated", 3),
]


def _header(mode: str, params: dict[str, Any]) -> str:
    return ";".join([mode, *(f"{k}={v}" for k, v in params.items())])


@pytest.mark.parametrize("via", ["admin", "header"])
@pytest.mark.parametrize(
    ("mode", "params", "expected", "chunks"),
    CASES,
    ids=[f"{c[0]}-{c[1].get('how', '')}" if c[0] == "garbled" else c[0] for c in CASES],
)
def test_mode_is_caught_by_the_load_client(
    clean: Engine, via: str, mode: str, params: dict[str, Any], expected: str, chunks: int
) -> None:
    eng = clean
    if via == "admin":
        r = eng.admin("POST", json={"mode": mode, **params})
        assert r.status_code == 200, r.text
        spec = spec_for(eng.url, **FAST)
    else:  # the header form over the text-completions API
        spec = spec_for(eng.url, header=_header(mode, params), api="completions", **FAST)
    records = attempts(spec, 3)
    for rec in records:
        assert rec["error_class"] == expected, rec
        assert len(rec["chunk_times"]) == chunks, rec
        assert rec["status"] == (None if mode == "hang" else 200)
    if mode == "hang":
        assert eng.health() == 200  # the health endpoint keeps saying yes
    # the same client, no fault: served fine
    if via == "admin":
        assert eng.admin("DELETE").json()["cleared"][0]["mode"] == mode
    control = attempts(spec_for(eng.url), 1)
    assert control[0]["ok"], control
    stats = window_stats(records + control)
    assert stats["requests"] == 4 and stats["failed"] == 3 and stats["availability"] == 0.25
    assert stats["errors_by_class"][expected]["count"] == 3
    if expected.startswith("timeout_"):
        assert stats["timeout_rate"] == 0.75
    # ground truth: the engine's ledger names exactly the sabotaged requests
    ids = {r["request_id"] for r in records}
    lines = eng.fault_lines(ids | {control[0]["request_id"]})
    assert {e["request_id"] for e in lines} == ids
    assert {(e["mode"], e["replica"], e["source"]) for e in lines} == {(mode, "f0", via)}
    assert eng.errors_logged() == []


def test_non_streaming_replies(clean: Engine) -> None:
    """Without streaming each mode still yields the reply a client must reject."""
    eng = clean
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6}

    def post(header: str) -> httpx.Response:
        return httpx.post(
            eng.url + "/v1/chat/completions",
            json=body,
            headers={"X-Chaos-Fault": header},
            timeout=3,
        )

    r = post("empty")
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["message"]["content"] == ""
    assert choice["finish_reason"] == "stop" and r.json()["usage"]["completion_tokens"] == 0
    r = post("truncated;k=2")
    assert r.json()["choices"][0]["finish_reason"] is None
    assert r.json()["usage"]["completion_tokens"] == 2
    r = post("error_in_stream")
    assert r.status_code == 200 and r.json()["error"]["code"] == 500
    r = post("garbled;how=bytes")
    with pytest.raises(UnicodeDecodeError):
        r.content.decode("utf-8")
    assert "\ufffd" in post("garbled;how=fffd").json()["choices"][0]["message"]["content"]
    with pytest.raises(httpx.TransportError):
        post("reset_after_k")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            eng.url + "/v1/chat/completions",
            json=body,
            headers={"X-Chaos-Fault": "hang"},
            timeout=0.3,
        )
    assert post("stall;k=1;t=0.3").elapsed.total_seconds() >= 0.3
    assert eng.errors_logged() == []


def test_probability_sabotages_a_share(clean: Engine) -> None:
    eng = clean
    r = eng.admin("POST", json={"mode": "empty", "probability": 0.5, "seed": 7})
    assert r.status_code == 200
    records = attempts(spec_for(eng.url, ttft_timeout_s=5.0, idle_timeout_s=5.0), 40)
    sabotaged = {e["request_id"] for e in eng.fault_lines({r["request_id"] for r in records})}
    failed = {r["request_id"] for r in records if r["error_class"] == "empty"}
    classes = [(r["error_class"], r["error"], r["request_id"] in sabotaged) for r in records]
    assert failed == sabotaged, classes
    assert 8 <= len(sabotaged) <= 32
    assert all(r["ok"] for r in records if r["request_id"] not in sabotaged), classes


def test_slo_check_counts_fault_classes_as_failures(clean: Engine, tmp_path: Path) -> None:
    eng = clean
    recs: list[dict[str, Any]] = []
    for mode in ("empty", "garbled", "truncated", "error_in_stream"):
        recs += attempts(spec_for(eng.url, header=mode), 1)
    recs += attempts(spec_for(eng.url), 4)
    with RecordWriter(tmp_path / "records.jsonl") as w:
        for rec in recs:
            w.write(rec)
    conf = {"infer_run_dir": str(tmp_path), "slo_availability": "0.9"}
    avail = slo_check("availability", window_s=60, configuration=conf)
    assert avail["requests"] == 8 and avail["value"] == 0.5 and avail["passed"] is False
    err = slo_check("error_rate", window_s=60, configuration=conf)
    assert err["value"] == 0.5 and err["passed"] is False
    assert slo_check("timeout_rate", window_s=60, configuration=conf)["passed"] is True
    by_class = window_stats(recs)["errors_by_class"]
    assert {k: v["count"] for k, v in by_class.items()} == {
        "empty": 1,
        "garbled": 1,
        "truncated": 1,
        "stream_error": 1,
    }


def test_slowdown_itl_grows_with_requests_served(clean: Engine) -> None:
    eng = clean
    assert eng.admin("POST", json={"mode": "slowdown", "factor": 0.5}).status_code == 200
    spec = spec_for(eng.url, max_tokens=10, idle_timeout_s=2.0)
    records = [attempts(spec, 1)[0] for _ in range(6)]  # one after the other
    assert all(r["ok"] for r in records)
    itl = [
        statistics.median(b - a for a, b in zip(ct, ct[1:], strict=False))
        for ct in (r["chunk_times"] for r in records)
    ]
    e2e = [r["end_at"] - r["sent_at"] for r in records]
    # request i is served after i others: ITL = 10 ms x (1 + 0.5 i)
    for i, v in enumerate(itl):
        assert v == pytest.approx(ITL_S * (1 + 0.5 * i), abs=0.004), itl
    assert e2e[-1] > 2.0 * e2e[0]
    assert all(b > a for a, b in zip(e2e, e2e[1:], strict=False)), e2e
    assert len(eng.fault_lines({r["request_id"] for r in records})) == 6
    stats = window_stats(records)
    assert stats["failed"] == 0 and stats["p99_itl_s"] > 1.3 * stats["p50_itl_s"]


@pytest.mark.parametrize(("via", "how"), [("admin", "exit"), ("header", "kill")])
def test_crash_on_long_prompt_kills_the_replica(tmp_path: Path, via: str, how: str) -> None:
    eng = Engine(tmp_path / "ledger.jsonl", "c0")
    try:
        header = None
        if via == "admin":
            r = eng.admin("POST", json={"mode": "crash_on_long_prompt", "n": 64, "how": how})
            assert r.status_code == 200
        else:
            header = f"crash_on_long_prompt;n=64;how={how}"
        spec = spec_for(eng.url, header=header)
        short = attempts(spec, 1)[0]  # ~20 prompt tokens: under the threshold
        assert short["ok"], short
        long_body = json.dumps(
            {
                "model": "sim",
                "max_tokens": 8,
                "stream": True,
                "messages": [{"role": "user", "content": "word " * 100}],  # 125 tokens
            }
        ).encode()
        crashed = attempts(spec, 1, body=long_body)[0]
        assert crashed["error_class"] in ("reset", "connect"), crashed
        assert eng.proc.wait(timeout=5) == (CRASH_EXIT_CODE if how == "exit" else -9)
        after = attempts(spec_for(eng.url), 1)[0]
        assert after["error_class"] == "connect"  # one input took the server down
        lines = eng.fault_lines()
        assert [(e["request_id"], e["mode"]) for e in lines] == [
            (crashed["request_id"], "crash_on_long_prompt")
        ]
        assert window_stats([short, crashed, after])["failed"] == 2
    finally:
        eng.stop()


def _long_body(words: int = 100) -> bytes:
    """A chat body of ``words`` x "word " (5 characters each: ``ceil(5 * words / 4)`` tokens)."""
    return json.dumps(
        {"model": "sim", "max_tokens": 8, "stream": True,
         "messages": [{"role": "user", "content": "word " * words}]}
    ).encode()  # fmt: skip


def test_crash_fault_survives_a_restart_until_cleared(tmp_path: Path) -> None:
    """crash_on_long_prompt is a deterministic bug: the restarted replica re-arms it from its
    fault-state file (ledger ``fault_restore``) and dies on the next long prompt too; the
    rollback, while the replica is down, removes it from the file, so the next start is clean.
    Records carry the prompt's size: the engine's count from usage, else our estimate, which
    for the crashed request equals the count the engine wrote in its fault line."""
    lab_dir, run_dir = tmp_path / "lab", tmp_path / "run"
    lab_dir.mkdir()
    state = ("--fault-state-dir", str(lab_dir / "engine-faults"))
    conf = {"infer_lab_dir": str(lab_dir), "infer_run_dir": str(run_dir)}
    eng = Engine(lab_dir / "ledger.jsonl", "r0", *state)
    engines = [eng]
    try:
        _fake_lab(lab_dir, eng)
        lab = Lab.attach(lab_dir)
        ef.set_engine_fault("crash_on_long_prompt", params={"n": 64}, configuration=conf)
        kept = json.loads((lab_dir / "engine-faults" / "r0.json").read_text())
        assert [(f["mode"], f["params"]["n"]) for f in kept] == [("crash_on_long_prompt", 64)]
        short = attempts(spec_for(eng.url), 1)[0]
        assert short["ok"] and short["prompt_tokens_source"] == "usage", short
        gen_end = next(e for e in read_jsonl(eng.ledger)
                       if e.get("request_id") == short["request_id"]
                       and e.get("event") == "generation_end")  # fmt: skip
        assert short["prompt_tokens"] == gen_end["prompt_tokens"]  # the engine's own count
        for life in range(2):  # the first process, then the restarted one: both die on it
            crashed = attempts(spec_for(eng.url), 1, body=_long_body())[0]
            assert crashed["error_class"] in ("reset", "connect"), crashed
            assert eng.proc.wait(timeout=5) == CRASH_EXIT_CODE
            line = eng.fault_lines({crashed["request_id"]})
            assert [(e["mode"], e["prompt_tokens"]) for e in line] == [
                ("crash_on_long_prompt", 125)
            ]
            assert (crashed["prompt_tokens"], crashed["prompt_tokens_source"]) == (125, "estimate")
            record = json.loads((lab_dir / "faults.json").read_text())[0]
            assert ef.fault_active(lab, record) is True  # down, but a restart re-arms it
            if life == 0:
                eng.stop()
                eng = Engine(lab_dir / "ledger.jsonl", "r0", *state)  # supervisord's restart
                engines.append(eng)
                _fake_lab(lab_dir, eng)
                armed = eng.admin("GET").json()["faults"]
                assert [(f["mode"], f["n"], f["id"]) for f in armed] == [
                    ("crash_on_long_prompt", 64, kept[0]["fault_id"])
                ]
                restores = [e for e in read_jsonl(eng.ledger) if e.get("event") == "fault_restore"]
                assert [(e["modes"], e["pid"]) for e in restores] == [
                    (["crash_on_long_prompt"], eng.proc.pid)
                ]
        # the rollback while the replica is down: removed from the file, not re-armed
        note = ef.clear_engine_faults(configuration=conf)["cleared"][0]
        assert "removed from its fault-state file" in note, note
        assert not (lab_dir / "engine-faults" / "r0.json").exists()
        assert ef.fault_active(lab, record) is False
        eng.stop()
        eng = Engine(lab_dir / "ledger.jsonl", "r0", *state)
        engines.append(eng)
        assert eng.admin("GET").json()["faults"] == []
        assert attempts(spec_for(eng.url), 1, body=_long_body())[0]["ok"]
    finally:
        for e in engines:
            e.stop()


# ---------------------------------------------------------------------------- health disagreement


def _samples(replica: str, t0: float, t1: float, healthy: bool = True) -> list[dict[str, Any]]:
    n = round((t1 - t0) / 0.2)
    return [{"t": t0 + 0.2 * i, "replica": replica, "healthy": healthy} for i in range(n + 1)]


def _rec(sent: float, end: float, ok: bool, replica: str | None = "r0", rid: str = "x") -> dict[str, Any]:  # fmt: skip
    return {"request_id": rid, "sent_at": sent, "end_at": end, "ok": ok, "replica": replica}


def test_health_disagreement_definition() -> None:
    t0 = 1000.0
    hung = [_rec(t0 - 1 + 0.5 * i, t0 + 0.5 * i + 1.0, False) for i in range(12)]
    res = health_disagreement(_samples("r0", t0, t0 + 5), hung, window_s=1.0)
    assert res["disagreement_s"] == pytest.approx(5.0)
    assert len(res["intervals"]) == 1 and res["intervals"][0]["attempts"] == 12
    assert res["by_replica"] == {"r0": pytest.approx(5.0)}
    # the health endpoint said unhealthy: it agrees with the failures
    assert health_disagreement(_samples("r0", t0, t0 + 5, False), hung)["disagreement_s"] == 0
    # serving fine, or no traffic at all: nothing to disagree with
    fine = [_rec(t0 + 0.3 * i, t0 + 0.3 * i + 0.1, True) for i in range(16)]
    assert health_disagreement(_samples("r0", t0, t0 + 5), fine)["disagreement_s"] == 0
    empty = health_disagreement(_samples("r0", t0, t0 + 5), [])
    assert empty["disagreement_s"] == 0 and empty["windows_judged"] == 0
    # half failing: not "none succeeded", unless the ratio says so
    mixed = fine + [_rec(t0 + 0.3 * i, t0 + 0.3 * i + 0.1, False) for i in range(16)]
    assert health_disagreement(_samples("r0", t0, t0 + 5), mixed)["disagreement_s"] == 0
    assert health_disagreement(_samples("r0", t0, t0 + 5), mixed, min_failed_ratio=0.5)[
        "disagreement_s"
    ] == pytest.approx(5.0)
    # failing early and late: two intervals; other replicas' records do not count
    parts = [_rec(t0 + 0.1, t0 + 1.9, False), _rec(t0 + 4.2, t0 + 4.3, False)]
    parts += [_rec(t0 + 2.2, t0 + 2.3, True), _rec(t0 + 3.1, t0 + 3.2, True)]
    parts += [_rec(t0 + 2.5, t0 + 3.5, False, replica="r1")]
    res = health_disagreement(_samples("r0", t0, t0 + 5), parts)
    assert [(iv["start"] - t0, iv["end"] - t0) for iv in res["intervals"]] == [
        pytest.approx((0.0, 2.0)),
        pytest.approx((4.0, 5.0)),
    ]
    assert res["disagreement_s"] == pytest.approx(3.0)
    # a record without a replica header is attributed through the server-side map
    anon = [_rec(t0, t0 + 5, False, replica=None, rid="abc")]
    assert health_disagreement(_samples("r0", t0, t0 + 5), anon)["disagreement_s"] == 0
    mapping = replica_of_requests([{"event": "fault", "replica": "r0", "request_id": "abc"}])
    res = health_disagreement(_samples("r0", t0, t0 + 5), anon, replica_of=mapping)
    assert res["disagreement_s"] == pytest.approx(5.0)
    # a sick health endpoint in the middle splits the interval
    samples = _samples("r0", t0, t0 + 5)
    for s in samples:
        if t0 + 2 <= s["t"] < t0 + 3:
            s["healthy"] = False
    res = health_disagreement(samples, hung)
    assert res["disagreement_s"] == pytest.approx(4.0) and len(res["intervals"]) == 2
    with pytest.raises(ValueError):
        health_disagreement([], [], window_s=0)
    with pytest.raises(ValueError):
        health_disagreement([], [], min_failed_ratio=0)
    assert replica_of_requests(routed=[("a", "r1"), ("b", "<NOSRV>")]) == {"a": "r1"}


def _load_and_sample(eng: Engine, out: Path, duration_s: float, ttft_s: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """Open-loop load (10 rps) while sampling /health every 0.1 s; returns (samples, records)."""
    samples: list[dict[str, Any]] = []
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            samples.append({"t": time.time(), "replica": "f0", "healthy": eng.health() == 200})
            stop.wait(0.1)

    th = threading.Thread(target=sampler)
    th.start()
    spec = spec_for(
        eng.url, rate_rps=10, duration_s=duration_s, arrival="constant", ttft_timeout_s=ttft_s
    )

    async def main() -> None:
        with RecordWriter(out) as w:
            await run_load(spec, w)

    try:
        asyncio.run(main())
    finally:
        stop.set()
        th.join()
    return samples, read_records(out)


def test_health_disagreement_catches_hang_live(clean: Engine, tmp_path: Path) -> None:
    eng = clean
    # healthy engine: the health endpoint and the completions agree
    samples, records = _load_and_sample(eng, tmp_path / "ok.jsonl", 2.0, ttft_s=3.0)
    ok = health_disagreement(samples, records, window_s=0.5)
    assert records and all(r["ok"] for r in records)
    assert ok["disagreement_s"] == 0 and ok["windows_judged"] >= 4
    # engine loop dead: /health still 200, every completion hangs
    assert eng.admin("POST", json={"mode": "hang"}).status_code == 200
    samples, records = _load_and_sample(eng, tmp_path / "hang.jsonl", 2.0, ttft_s=0.5)
    assert all(s["healthy"] for s in samples)
    assert records and all(r["error_class"] == "timeout_ttft" for r in records)
    assert all(r["replica"] is None for r in records)  # no header came back
    mapping = replica_of_requests(read_jsonl(eng.ledger))
    res = health_disagreement(samples, records, window_s=0.5, replica_of=mapping)
    span = samples[-1]["t"] - samples[0]["t"]
    assert res["disagreement_s"] >= span - 0.5 and span > 2.0
    assert sum(iv["attempts"] for iv in res["intervals"]) == len(records)


# ---------------------------------------------------------------------------- actions and probe


def _fake_lab(lab_dir: Path, eng: Engine) -> None:
    """A lab.json describing one replica served by ``eng`` (no supervisord, no HAProxy)."""
    lab_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "lab_id": "test",
        "state_dir": str(lab_dir),
        "url": eng.url,
        "port": eng.port,
        "engine": "sim",
        "engine_args": {},
        "health_path": "/health",
        "cgroup_version": 2,
        "cgroup_root": str(lab_dir / "no-cgroup"),
        "replicas": [{"name": "r0", "port": eng.port, "cgroup": str(lab_dir / "no-cgroup")}],
        "pids": {},
    }
    (lab_dir / "lab.json").write_text(json.dumps(meta))


def _background_load(
    eng: Engine, records: Path, duration_s: float, ttft_s: float = 0.5
) -> threading.Thread:
    spec = spec_for(
        eng.url, rate_rps=10, duration_s=duration_s, arrival="constant", ttft_timeout_s=ttft_s
    )

    def run() -> None:
        async def main() -> None:
            with RecordWriter(records, append=True) as w:
                await run_load(spec, w)

        asyncio.run(main())

    th = threading.Thread(target=run)
    th.start()
    return th


def test_actions_probe_and_figures(tmp_path: Path) -> None:
    lab_dir, run_dir = tmp_path / "lab", tmp_path / "run"
    lab_dir.mkdir()
    eng = Engine(lab_dir / "ledger.jsonl", "r0")
    conf = {"infer_lab_dir": str(lab_dir), "infer_run_dir": str(run_dir)}
    try:
        _fake_lab(lab_dir, eng)
        lab = Lab.attach(lab_dir)
        with pytest.raises(ActivityFailed, match="unknown engine fault mode"):
            ef.set_engine_fault("melt", configuration=conf)
        with pytest.raises(ActivityFailed, match="refused"):
            ef.set_engine_fault("stall", params={"k": -1}, configuration=conf)
        assert json.loads((lab_dir / "faults.json").read_text()) == []  # nothing left recorded

        out = ef.set_engine_fault("hang", configuration=conf)
        assert out["replicas"] == ["r0"] and out["faults"][0]["mode"] == "hang"
        recorded = json.loads((lab_dir / "faults.json").read_text())
        assert [(f["kind"], f["module"], f["mode"], f["port"]) for f in recorded] == [
            ("engine-fault", ef.MODULE, "hang", eng.port)
        ]
        assert ef.fault_active(lab, recorded[0]) is True
        load = _background_load(eng, run_dir / "records.jsonl", 3.0)
        time.sleep(0.7)  # the first hung attempts have timed out (ttft 0.5 s)
        chk = health_disagreement_check(
            "r0", duration_s=1.5, window_s=0.5, settle_s=0.6, configuration=conf
        )
        assert chk["passed"] is False and chk["healthy_samples"] == chk["samples"] >= 7
        assert chk["disagreement_s"] >= 1.0
        ef.clear_engine_faults(configuration=conf)
        assert ef.fault_active(lab, recorded[0]) is False
        assert json.loads((lab_dir / "faults.json").read_text()) == []
        load.join()
        load = _background_load(eng, run_dir / "records.jsonl", 2.0, ttft_s=3.0)
        time.sleep(0.3)
        healthy = health_disagreement_check(
            "r0", duration_s=1.2, window_s=0.5, settle_s=0.3, configuration=conf
        )
        load.join()
        assert healthy["passed"] is True and healthy["disagreement_s"] == 0
        logged = read_jsonl(run_dir / "faults.jsonl")
        assert [(f["kind"], f["phase"], f["mode"]) for f in logged] == [
            ("engine-fault", "set", "hang"),
            ("engine-fault", "cleared", "all"),
        ]
        # figures: the ledger's sabotaged requests, all caught by the client
        records = read_records(run_dir / "records.jsonl")
        ctx = DrillContext(run_dir, records, logged, [], read_jsonl(lab_dir / "ledger.jsonl"))
        fig, ground = ev.compute(ctx)
        hung = [r for r in records if r["error_class"] in ("timeout_ttft", "http_5xx")]
        # most timed out at the client; those still hanging at the clear got the release 503
        assert {r["error_class"] for r in hung} == {"timeout_ttft", "http_5xx"}
        assert fig["sabotaged_requests"] == len(hung) >= 20
        assert fig["caught_requests"] == len(hung) and fig["missed_requests"] == 0
        assert fig["sabotaged_by_mode"] == {"hang": len(hung)}
        assert fig["health_disagreement_s"] >= chk["disagreement_s"] - 0.001  # probe rounds to ms
        assert ground["modes"] == ["hang"] and ground["replicas"] == ["r0"]
        assert ground["fault_at"] == pytest.approx(out["fault_at"])
        assert ground["cleared_at"] > ground["fault_at"]

        # the generic rollback undoes an engine fault through this module; a dead replica counts
        ef.set_engine_fault("empty", params={}, ttl_s=60, configuration=conf)
        notes = lab.clear_faults()
        assert any("disarmed empty" in n for n in notes), notes
        assert eng.admin("GET").json()["faults"] == []
        ef.set_engine_fault("empty", configuration=conf)
        eng.stop()
        record = json.loads((lab_dir / "faults.json").read_text())[0]
        assert ef.fault_active(lab, record) is False
        assert "not running" in (ef.undo_fault(lab, record) or "")
        assert "not running" in ef.clear_engine_faults(configuration=conf)["cleared"][0]
        assert json.loads((lab_dir / "faults.json").read_text()) == []
    finally:
        eng.stop()


def test_clearing_a_hang_releases_hung_requests(clean: Engine) -> None:
    eng = clean
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    results: list[tuple[int, float]] = []

    def call() -> None:
        t0 = time.monotonic()
        r = httpx.post(eng.url + "/v1/chat/completions", json=body, timeout=10)
        results.append((r.status_code, time.monotonic() - t0))

    assert eng.admin("POST", json={"mode": "hang"}).status_code == 200
    threads = [threading.Thread(target=call) for _ in range(2)]
    for th in threads:
        th.start()
    time.sleep(0.5)
    assert results == []  # still hanging
    assert eng.admin("DELETE").json()["released_hung_requests"] == 2
    for th in threads:
        th.join()
    assert [code for code, _ in results] == [503, 503]
    # with a ttl, the hang (and what it holds) ends by itself
    assert eng.admin("POST", json={"mode": "hang", "ttl_s": 0.4}).status_code == 200
    call()
    assert results[-1][0] == 503 and 0.35 <= results[-1][1] < 2.0
    assert eng.admin("GET").json()["faults"] == []
    assert attempts(spec_for(eng.url), 1)[0]["ok"]


def _raw_stream(port: int, header: str) -> tuple[bytes, str]:
    """Raw-socket streaming request; returns (bytes received, how the connection ended)."""
    body = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"X-Chaos-Fault: {header}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        sock.sendall(head + body)
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                return got, "rst"
            if not data:
                return got, "fin"
            got += data


def test_reset_is_a_tcp_abort_and_truncated_a_clean_end(clean: Engine) -> None:
    got, end = _raw_stream(clean.port, "reset_after_k;k=2")
    assert end == "rst" and got.count(b'"content":') == 2 and b"0\r\n\r\n" not in got
    got, end = _raw_stream(clean.port, "truncated;k=2")
    assert end == "fin" and got.count(b'"content":') == 2
    assert got.endswith(b"0\r\n\r\n")  # the chunked body ends properly: a clean close
    assert b'finish_reason":"' not in got and b"[DONE]" not in got


# ---------------------------------------------------------------------------- in the real lab


@pytest.mark.lab
def test_engine_faults_in_the_lab(tmp_path: Path) -> None:
    """Through HAProxy: a hung replica keeps passing its health check (health disagreement), and
    one long prompt takes a replica down (supervisord restarts it); no fault left afterwards.

    HAProxy balances ``leastconn`` and keeps its side of a hung request open after the client gave
    up, so it routes around the hung replica after one request: the client's TTFT timeout (4 s) is
    set longer than the probe's window so that request spans it."""
    lab_dir, run_dir = tmp_path / "lab", tmp_path / "run"
    conf = {"infer_lab_dir": str(lab_dir), "infer_run_dir": str(run_dir)}
    lab = Lab.up(
        lab_dir,
        replicas=2,
        engine="sim",
        memory_limit_mb=256,
        engine_args={"load_delay_s": 0.3, "warmup_requests": 0, "itl_s": ITL_S},
        ready_timeout_s=30,
    )
    try:
        spec = LoadSpec(
            url=lab.url, rate_rps=10, duration_s=7.5, max_tokens=8, ttft_timeout_s=4.0,
            arrival="constant", timeout_s=5.0,
        )  # fmt: skip
        run_dir.mkdir()

        def load() -> None:
            async def main() -> None:
                with RecordWriter(run_dir / "records.jsonl") as w:
                    await run_load(spec, w)

            asyncio.run(main())

        th = threading.Thread(target=load)
        th.start()
        time.sleep(1.0)
        ef.set_engine_fault("hang", replica="r0", configuration=conf)
        assert [f["mode"] for f in lab.status()["active_faults"]] == ["hang"]
        chk = health_disagreement_check(
            "r0", duration_s=2.0, window_s=0.5, settle_s=3.0, configuration=conf
        )
        cleared_at = time.time()
        ef.clear_engine_faults(configuration=conf)  # also drops the hung requests (503)
        th.join()
        assert chk["healthy_samples"] == chk["samples"]  # /health said 200 all along
        # the first window may end before HAProxy routes a request to r0
        assert chk["passed"] is False and chk["disagreement_s"] >= 1.0, chk
        # once cleared, HAProxy's hung slot is freed and r0 serves again
        after = [
            r for r in read_records(run_dir / "records.jsonl") if r["sent_at"] > cleared_at + 0.2
        ]
        assert any(r["replica"] == "r0" for r in after) and all(r["ok"] for r in after)

        # one long prompt through the load balancer kills whichever replica gets it
        ef.set_engine_fault("crash_on_long_prompt", replica="all", params={"n": 64}, configuration=conf)  # fmt: skip
        long_body = json.dumps(
            {"model": "sim", "max_tokens": 8, "stream": True,
             "messages": [{"role": "user", "content": "word " * 100}]}
        ).encode()  # fmt: skip
        crashed = attempts(spec_for(lab.url), 1, body=long_body)[0]
        assert crashed["error_class"] in ("http_5xx", "reset"), crashed
        # no usage from a crash: the record carries our estimate of the prompt, marked so
        assert (crashed["prompt_tokens"], crashed["prompt_tokens_source"]) == (125, "estimate")
        line = [
            e
            for e in read_jsonl(lab_dir / "ledger.jsonl")
            if e.get("request_id") == crashed["request_id"]
        ]
        assert [e["event"] for e in line] == ["fault"]
        victim = line[0]["replica"]
        deadline = time.monotonic() + 20
        while not any(
            e.get("event") == "exit" and e.get("replica") == victim for e in lab.events()
        ):
            assert time.monotonic() < deadline, "the crash left no exit event"
            time.sleep(0.05)
        lab.wait_healthy(30)
        exits = [e for e in lab.events() if e.get("event") == "exit"]
        assert [(e["replica"], e["cause"]) for e in exits] == [(victim, f"exit:{CRASH_EXIT_CODE}")]
        # a deterministic bug: the restarted replica re-armed it from its fault-state file
        assert sorted(f["replica"] for f in lab.status()["active_faults"]) == ["r0", "r1"]
        restored = [
            e for e in read_jsonl(lab_dir / "ledger.jsonl") if e.get("event") == "fault_restore"
        ]
        assert [(e["replica"], e["modes"]) for e in restored] == [
            (victim, ["crash_on_long_prompt"])
        ]
        short = attempts(spec_for(lab.url), 6)  # short prompts: both replicas serve them
        assert all(r["ok"] and r["prompt_tokens_source"] == "usage" for r in short), short
        with RecordWriter(run_dir / "records.jsonl", append=True) as w:
            for r in [crashed, *short]:
                w.write(r)
        ef.clear_engine_faults(configuration=conf)
        assert lab.status()["active_faults"] == []
        assert not list((lab_dir / "engine-faults").glob("*.json"))  # nothing to re-arm

        records = read_records(run_dir / "records.jsonl")
        ctx = DrillContext(
            run_dir,
            records,
            read_jsonl(run_dir / "faults.jsonl"),
            lab.events(),
            read_jsonl(lab_dir / "ledger.jsonl"),
            lab.served,
        )
        fig, ground = ev.compute(ctx)
        # the crash told whole: exit code, restart, restart time, the prompt it died on
        assert (fig["replica_exits"], fig["replica_restarts"]) == (1, 1)
        assert fig["exit_codes"] == {f"exit:{CRASH_EXIT_CODE}": 1}
        died = next(e for e in ground["replica_exits"] if e["replica"] == victim)
        ready = next(
            e["t"] for e in lab.events() if e.get("event") == "ready" and e["t"] > died["t"]
        )
        served = lab.served(victim, died["t"])
        assert served is not None and served >= ready  # it served one of the short requests
        assert fig["restart_s"] == pytest.approx(served - died["t"])
        assert [(p["request_id"], p["prompt_tokens"]) for p in died["died_on"]] == [
            (crashed["request_id"], 125)
        ]
        assert fig["crash_prompt_tokens"] == [125]
        assert ground["crash_trigger"] == (
            "armed on prompts over 64 tokens; died on prompts of 125 tokens (engine count)"
        )
        hang_ids = {e["request_id"] for e in ctx.ledger if e.get("mode") == "hang"}
        hung = [r for r in records if r["request_id"] in hang_ids]
        # timed out at the client, or (still hanging at the clear) dropped with the release 503
        assert hung and {r["error_class"] for r in hung} <= {"timeout_ttft", "http_5xx"}, hung
        assert fig["sabotaged_by_mode"] == {"hang": len(hung), "crash_on_long_prompt": 1}
        assert fig["caught_requests"] == fig["sabotaged_requests"] == len(hung) + 1
        assert fig["health_disagreement_s"] >= chk["disagreement_s"] - 0.001
        assert [(e["replica"], e["cause"]) for e in ground["replica_exits"]] == [
            (victim, f"exit:{CRASH_EXIT_CODE}")
        ]
        # every client failure was sabotaged on purpose: the others were served
        assert {r["request_id"] for r in records if not r["ok"]} == {
            e["request_id"] for e in ctx.ledger if e.get("event") == "fault"
        } & {r["request_id"] for r in records}
        lab.down()
        pids = {int(e["pid"]) for e in lab.events() if e.get("pid")}
        assert len(pids) >= 3 and not [pid for pid in pids if _running(pid)]
    finally:
        lab.down()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
