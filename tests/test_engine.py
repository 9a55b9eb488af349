"""Tests for the simulated lab engine (chaoslib_infer.lab.engine).

Most tests run the app in-process through httpx.ASGITransport (which buffers whole responses);
timing, disconnect and memory tests use a real subprocess on a real loopback socket.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from labutil import engine_argv

from chaoslib_infer.lab.engine import (
    EngineConfig,
    build_app,
    count_text_tokens,
    generate_tokens,
    parse_args,
)

pytestmark = pytest.mark.anyio

CJK = re.compile(r"[\u4e00-\u9fff]")

VLLM_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_success_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


@pytest.fixture
def anyio_backend() -> str:
    """Run async tests on asyncio only."""
    return "asyncio"


def fast_config(**kw: Any) -> EngineConfig:
    """An engine config with no load delay / warm-up and short timings."""
    base: dict[str, Any] = {
        "load_delay_s": 0.0,
        "warmup_requests": 0,
        "itl_s": 0.001,
        "prefill_s_per_token": 0.0,
        "replica_id": "rT",
    }
    base.update(kw)
    return EngineConfig(**base)


def client_for(config: EngineConfig) -> httpx.AsyncClient:
    """An in-process httpx client for a fresh app."""
    app = build_app(config)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine")


def sse_events(raw: bytes) -> list[str]:
    """Split an SSE body into its ``data:`` payloads (strict UTF-8)."""
    text = raw.decode("utf-8", errors="strict")
    out = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            out.append(block[len("data: ") :])
    return out


def chat_body(**kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "x", "messages": [{"role": "user", "content": "hello world"}]}
    body.update(kw)
    return body


# ---------------------------------------------------------------- in-process shape tests


async def test_chat_stream_shape() -> None:
    async with client_for(fast_config()) as c:
        r = await c.post(
            "/v1/chat/completions",
            json=chat_body(max_tokens=7, stream=True, stream_options={"include_usage": True}),
            headers={"X-Request-Id": "req-1"},
        )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-replica-id"] == "rT"
    assert r.headers["x-request-id"] == "req-1"
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    for ch in chunks:
        assert ch["id"] == "chatcmpl-req-1"
        assert ch["object"] == "chat.completion.chunk"
        assert ch["model"] == "chaos-sim"
        assert isinstance(ch["created"], int)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    content = chunks[1:-2]
    assert len(content) == 7
    assert all(ch["choices"][0]["finish_reason"] is None for ch in content)
    assert all(ch["choices"][0]["delta"]["content"] for ch in content)
    final = chunks[-2]["choices"][0]
    assert final["finish_reason"] == "length" and final["delta"] == {}
    usage = chunks[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(content)
    assert usage["usage"]["prompt_tokens"] == count_text_tokens("hello world")
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 7
    text = "".join(ch["choices"][0]["delta"]["content"] for ch in content)
    assert CJK.search(text)
    assert text == "".join(generate_tokens("req-1", 7))  # deterministic per request id


async def test_stream_without_usage_and_default_length() -> None:
    async with client_for(fast_config(output_tokens=5)) as c:
        r = await c.post("/v1/chat/completions", json=chat_body(stream=True))
    events = sse_events(r.content)
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]"
    assert all("usage" not in ch for ch in chunks)
    assert len(chunks) == 1 + 5 + 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"  # natural end, no max_tokens


async def test_completions_stream_shape() -> None:
    async with client_for(fast_config()) as c:
        r = await c.post(
            "/v1/completions",
            json={
                "prompt": "abcdefgh",
                "max_tokens": 4,
                "stream": True,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            },
        )
    events = sse_events(r.content)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(ch["object"] == "text_completion" for ch in chunks)
    assert [ch["choices"][0]["finish_reason"] for ch in chunks[:-1]] == [None] * 4 + ["length"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


async def test_non_streaming_shapes() -> None:
    async with client_for(fast_config()) as c:
        r = await c.post(
            "/v1/chat/completions",
            json=chat_body(max_completion_tokens=6),
            headers={"X-Request-Id": "nb"},
        )
        r2 = await c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3})
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == "chatcmpl-nb" and body["object"] == "chat.completion"
    assert set(body) >= {"id", "object", "created", "model", "choices", "usage"}
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "".join(generate_tokens("nb", 6))
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 6
    assert CJK.search(choice["message"]["content"])
    r.content.decode("utf-8", errors="strict")
    body2 = r2.json()
    assert body2["object"] == "text_completion"
    assert body2["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert isinstance(body2["choices"][0]["text"], str)
    assert r2.headers["x-replica-id"] == "rT" and len(r2.headers["x-request-id"]) == 32


@pytest.mark.parametrize(
    ("path", "content", "fragment"),
    [
        ("/v1/chat/completions", b"{not json", "invalid JSON"),
        ("/v1/chat/completions", b'{"model": "x"}', "messages"),
        ("/v1/chat/completions", b'{"messages": []}', "messages"),
        ("/v1/completions", b'{"model": "x"}', "prompt"),
        ("/v1/completions", b'{"prompt": "a", "max_tokens": 0}', "max_tokens"),
        ("/v1/completions", b"[1, 2]", "object"),
    ],
)
async def test_bad_requests_get_openai_error(path: str, content: bytes, fragment: str) -> None:
    async with client_for(fast_config()) as c:
        r = await c.post(path, content=content, headers={"X-Request-Id": "bad"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"}
    assert err["code"] == 400 and fragment in err["message"]
    assert r.headers["x-replica-id"] == "rT" and r.headers["x-request-id"] == "bad"


async def test_health_503_while_loading_then_200() -> None:
    async with client_for(fast_config(load_delay_s=0.4)) as c:
        h = await c.get("/health")
        comp = await c.post("/v1/chat/completions", json=chat_body(max_tokens=1))
        assert h.status_code == 503 and comp.status_code == 503
        assert comp.json()["error"]["code"] == 503
        assert h.headers["x-replica-id"] == "rT"
        await asyncio.sleep(0.45)
        h2 = await c.get("/health")
        comp2 = await c.post("/v1/chat/completions", json=chat_body(max_tokens=1))
        models = await c.get("/v1/models")
    assert h2.status_code == 200 and comp2.status_code == 200
    assert models.json()["data"][0]["id"] == "chaos-sim"


@pytest.mark.parametrize("status", [429, 503])
async def test_queue_full_status(status: int) -> None:
    cfg = fast_config(max_num_seqs=1, max_waiting=0, itl_s=0.02, queue_full_status=status)
    async with client_for(cfg) as c:
        first = asyncio.create_task(
            c.post("/v1/chat/completions", json=chat_body(max_tokens=10, stream=True))
        )
        await asyncio.sleep(0.05)  # first request now holds the only slot
        t = time.perf_counter()
        rejected = await c.post("/v1/chat/completions", json=chat_body(max_tokens=10))
        elapsed = time.perf_counter() - t
        ok = await first
    assert ok.status_code == 200
    assert rejected.status_code == status
    assert elapsed < 0.1  # answered at once, not after the first finishes
    assert rejected.json()["error"]["code"] == status
    assert rejected.headers["x-replica-id"] == "rT"


async def test_waiting_queue_serves_in_order() -> None:
    cfg = fast_config(max_num_seqs=1, max_waiting=2, itl_s=0.01)
    async with client_for(cfg) as c:
        app_engine = c._transport.app.state.engine  # type: ignore[attr-defined]
        tasks = [
            asyncio.create_task(c.post("/v1/completions", json={"prompt": "p", "max_tokens": 5}))
            for _ in range(3)
        ]
        await asyncio.sleep(0.02)
        assert app_engine.scheduler.running == 1
        assert len(app_engine.scheduler.waiters) == 2
        metrics = (await c.get("/metrics")).text
        assert 'vllm:num_requests_waiting{model_name="chaos-sim"} 2.0' in metrics
        assert app_engine.kv_tokens > 0
        results = await asyncio.gather(*tasks)
    assert [r.status_code for r in results] == [200, 200, 200]
    assert app_engine.scheduler.running == 0 and app_engine.kv_tokens == 0


async def test_disconnect_while_waiting_leaves_the_queue() -> None:
    app = build_app(fast_config(max_num_seqs=1, max_waiting=2, itl_s=0.02))
    engine = app.state.engine
    gone = asyncio.Event()
    sent: list[dict[str, Any]] = []
    body = json.dumps(chat_body(max_tokens=5, stream=True)).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
        "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
        "server": ("engine", 80), "client": ("test", 1),
    }  # fmt: skip
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as c:
        first = asyncio.create_task(
            c.post("/v1/chat/completions", json=chat_body(max_tokens=10, stream=True))
        )
        await asyncio.sleep(0.02)
        second = asyncio.create_task(app(scope, receive, send))
        await asyncio.sleep(0.02)
        assert engine.scheduler.running == 1 and len(engine.scheduler.waiters) == 1
        gone.set()  # the waiting client goes away
        await asyncio.wait_for(second, 1)
        assert len(engine.scheduler.waiters) == 0
        assert (await first).status_code == 200
    assert sent[0]["status"] == 200 and engine.scheduler.running == 0 and engine.kv_tokens == 0


async def test_warmup_penalty_decays() -> None:
    cfg = fast_config(warmup_requests=2, warmup_penalty_s=0.2)
    durations = []
    async with client_for(cfg) as c:
        for _ in range(3):
            t = time.perf_counter()
            await c.post("/v1/completions", json={"prompt": "p", "max_tokens": 1})
            durations.append(time.perf_counter() - t)
    assert durations[0] >= 0.19
    assert 0.09 <= durations[1] < durations[0]
    assert durations[2] < 0.05


async def test_ledger_and_metrics(tmp_path: Path) -> None:
    ledger = tmp_path / "sub" / "ledger.jsonl"
    async with client_for(fast_config(ledger=ledger)) as c:
        for i in range(3):
            await c.post(
                "/v1/chat/completions",
                json=chat_body(max_tokens=2),
                headers={"X-Request-Id": f"L{i}"},
            )
        await c.post("/v1/chat/completions", content=b"nope")  # no generation, no ledger line
        metrics = await c.get("/metrics", headers={"X-Request-Id": "m"})
    every = [json.loads(x) for x in ledger.read_text().splitlines()]
    lines = [x for x in every if x["event"] == "generation"]
    assert [x["request_id"] for x in lines] == ["L0", "L1", "L2"]
    for x in lines:
        assert x["event"] == "generation" and x["replica"] == "rT" and x["pid"] == os.getpid()
        assert abs(x["t"] - time.time()) < 60
    # each generation's end: the tokens it cost (ground truth for wasted tokens)
    ends = [x for x in every if x["event"] == "generation_end"]
    assert [(x["request_id"], x["completion_tokens"], x["outcome"]) for x in ends] == [
        ("L0", 2, "done"),
        ("L1", 2, "done"),
        ("L2", 2, "done"),
    ]
    assert all(x["prompt_tokens"] > 0 and x["replica"] == "rT" for x in ends)
    assert len(every) == 6
    assert metrics.headers["x-request-id"] == "m" and metrics.headers["x-replica-id"] == "rT"
    text = metrics.text
    for name in VLLM_METRICS:
        assert f"{name}{{" in text or f"{name}_count{{" in text, name
    assert 'vllm:request_success_total{finished_reason="length",model_name="chaos-sim"} 3.0' in text
    assert 'vllm:generation_tokens_total{model_name="chaos-sim"} 6.0' in text


def test_parse_args_defaults_and_flags() -> None:
    d = parse_args([])
    assert d == EngineConfig()
    assert (d.itl_s, d.max_num_seqs, d.max_waiting, d.kv_cache_tokens) == (0.02, 16, 64, 65536)
    c = parse_args(
        ["--port", "0", "--replica-id", "r2", "--queue-full-status", "503", "--zero-latency"]
    )
    assert (c.port, c.replica_id, c.queue_full_status, c.zero_latency) == (0, "r2", 503, True)
    with pytest.raises(SystemExit):
        parse_args(["--queue-full-status", "500"])


# ---------------------------------------------------------------- real subprocess + socket


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real engine subprocess on 127.0.0.1 (port 0) with a ledger; yields url, pid, ledger."""
    ledger = tmp_path_factory.mktemp("engine") / "ledger.jsonl"
    proc = subprocess.Popen(
        engine_argv(
            "sub0",
            ledger,
            "--load-delay-s",
            "1.5",  # long enough to see the 503 on a loaded machine
            "--warmup-requests",
            "0",
            "--itl-s",
            "0.02",
            "--prefill-s-per-token",
            "0",
            "--kv-bytes-per-token",
            "16384",
        ),  # fmt: skip
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"port=(\d+)", line)
        assert m, line
        url = f"http://127.0.0.1:{m.group(1)}"
        deadline = time.monotonic() + 15
        seen_503 = False
        while True:
            try:
                code = httpx.get(url + "/health", timeout=1).status_code
            except httpx.TransportError:
                code = 0
            seen_503 |= code == 503
            if code == 200:
                break
            assert time.monotonic() < deadline, "engine never became healthy"
            time.sleep(0.02)
        yield {"url": url, "pid": proc.pid, "ledger": ledger, "seen_503": seen_503}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_subprocess_stream_and_pacing(server: dict[str, Any]) -> None:
    assert server["seen_503"]  # /health answered 503 during the load delay
    times: list[float] = []
    raw = b""
    with httpx.stream(
        "POST",
        server["url"] + "/v1/chat/completions",
        json=chat_body(max_tokens=30, stream=True, stream_options={"include_usage": True}),
        headers={"X-Request-Id": "pace-1"},
        timeout=10,
    ) as r:
        assert r.headers["x-replica-id"] == "sub0" and r.headers["x-request-id"] == "pace-1"
        for data in r.iter_raw():
            raw += data
            times.extend([time.perf_counter()] * data.count(b'"content":'))
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 30 == len(times)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert abs(statistics.median(gaps) - 0.02) < 0.006, gaps
    assert sum(gaps) == pytest.approx(29 * 0.02, abs=0.05)  # absolute deadlines: no drift
    ledger = [json.loads(x) for x in server["ledger"].read_text().splitlines()]
    assert any(x["request_id"] == "pace-1" and x["pid"] == server["pid"] for x in ledger)


def test_subprocess_disconnect_frees_kv_and_memory(server: dict[str, Any]) -> None:
    url, pid = server["url"], server["pid"]
    baseline = _rss_bytes(pid)
    prompt = "x" * (4 * 4000)  # ~4000 prompt tokens * 16 KiB = ~62 MiB of KV bytes
    with httpx.stream(
        "POST",
        url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 500, "stream": True},
        headers={"X-Request-Id": "gone-1"},
        timeout=10,
    ) as r:
        it = r.iter_raw()
        got = b""
        while got.count(b"data: ") < 3:
            got += next(it)
        held = _rss_bytes(pid)
        m = httpx.get(url + "/metrics").text
        assert _metric(m, "vllm:num_requests_running") == 1.0
        assert _metric(m, "vllm:kv_cache_usage_perc") > 4000 / 65536
    # the client closed the stream mid-generation
    assert held - baseline > 50 * 2**20
    deadline = time.monotonic() + 5
    while True:
        m = httpx.get(url + "/metrics").text
        if _metric(m, "vllm:num_requests_running") == 0.0:
            break
        assert time.monotonic() < deadline, "generation not stopped after disconnect"
        time.sleep(0.02)
    assert _metric(m, "vllm:kv_cache_usage_perc") == 0.0
    assert 'finished_reason="abort"' in m
    assert _rss_bytes(pid) - baseline < 20 * 2**20  # KV bytes went back to the OS
    # the cut-short generation's end line: what it cost before the client went away
    ledger = [json.loads(x) for x in server["ledger"].read_text().splitlines()]
    (end,) = [x for x in ledger if x["request_id"] == "gone-1" and x["event"] == "generation_end"]
    assert end["outcome"] == "cancelled" and end["pid"] == pid
    assert 3 <= end["completion_tokens"] < 500 and end["prompt_tokens"] > 3000
