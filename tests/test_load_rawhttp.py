"""The raw transport (``load.rawhttp``): same records and error classes as the aiohttp path.

``test_load_client`` runs its cases on the default transport; ``test_error_classes_other_transport``
runs the same cases on the other one, so both transports meet every expected error class.
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_load_client import CASES, _closed_port, check_types

from chaoslib_infer.load.client import (
    LoadSpec,
    build_body,
    make_session,
    run_load_blocking,
    send_attempt,
)
from chaoslib_infer.load.fakeserver import FakeServer
from chaoslib_infer.load.rawhttp import RawSession
from chaoslib_infer.load.records import read_records

# timing-sensitive: scripts/quickstart test runs it alone, after the parallel pass
pytestmark = [pytest.mark.serial]

SSE_OK = (
    b'data: {"choices":[{"index":0,"text":"ab"}]}\n\n'
    b'data: {"choices":[{"index":0,"text":"cd","finish_reason":"length"}]}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    with FakeServer(replica="fx") as srv:
        yield srv


DEFAULT_TRANSPORT = LoadSpec.__dataclass_fields__["transport"].default
OTHER_TRANSPORT = "aiohttp" if DEFAULT_TRANSPORT == "raw" else "raw"


def attempt(url: str, n: int = 1, **kw: Any) -> list[dict[str, Any]]:
    """``n`` sequential attempts through one session (``kw`` go to ``LoadSpec``; raw unless
    ``transport`` says otherwise)."""
    kw.setdefault("transport", "raw")
    spec = LoadSpec(url=url, **kw)

    async def go() -> list[dict[str, Any]]:
        async with make_session(spec) as s:
            assert isinstance(s, RawSession) == (spec.transport == "raw")
            body = json.dumps(build_body(spec, random.Random(0))).encode()
            return [await send_attempt(s, spec, body, f"req-{i}", 1, None) for i in range(n)]

    return asyncio.run(go())


@pytest.mark.parametrize("path,expected,status", CASES)
def test_error_classes_other_transport(
    server: FakeServer, path: str, expected: str, status: int | None
) -> None:
    (r,) = attempt(
        server.url + "/" + path,
        ttft_timeout_s=0.4,
        idle_timeout_s=0.3,
        timeout_s=0.8,
        transport=OTHER_TRANSPORT,
    )
    check_types(r)
    assert (r["ok"], r["error_class"], r["status"]) == (False, expected, status), r["error"]
    assert r["error"]
    if expected.startswith("timeout_"):
        limit = {"timeout_ttft": 0.4, "timeout_idle": 0.3, "timeout_total": 0.8}[expected]
        assert limit * 0.95 <= r["end_at"] - r["sent_at"] < 0.8 + 0.5


def test_ok_records_and_keepalive_reuse(server: FakeServer) -> None:
    spec = LoadSpec(url=server.url + "/mode=ok,tokens=6,itl=0.005", transport="raw")

    async def go() -> tuple[list[dict[str, Any]], int]:
        async with RawSession(spec) as s:
            body = json.dumps(build_body(spec, random.Random(0))).encode()
            recs = [await send_attempt(s, spec, body, f"r{i}") for i in range(3)]
            return recs, s.connections_made

    recs, conns = asyncio.run(go())
    assert conns == 1  # three requests, one keep-alive connection
    for r in recs:
        check_types(r)
        assert r["ok"] and r["status"] == 200 and r["replica"] == "fx"
        assert r["sent_at"] <= r["first_byte_at"] <= r["first_token_at"] <= r["end_at"]
        assert len(r["chunk_times"]) == 6 and r["chunk_times"][0] == r["first_token_at"]
        assert r["output_tokens"] == 6 and r["tokens_source"] == "usage" and r["text_len"] == 18
        gaps = [b - a for a, b in zip(r["chunk_times"], r["chunk_times"][1:], strict=False)]
        assert min(gaps) > 0.003


def test_split_cjk_chunks_completions_and_hang_after_done(server: FakeServer) -> None:
    (r,) = attempt(server.url + "/mode=ok,tokens=3,text=cjk,split=1")
    assert r["ok"] and r["text_len"] == 12
    (r,) = attempt(server.url + "/mode=ok,tokens=5", include_usage=False, api="completions")
    assert r["ok"] and r["output_tokens"] == 5 and r["tokens_source"] == "chunks"
    (r,) = attempt(server.url + "/mode=hang", idle_timeout_s=2.0)
    assert r["ok"] and r["end_at"] - r["sent_at"] < 0.3


def test_connect_refused() -> None:
    (r,) = attempt(f"http://127.0.0.1:{_closed_port()}")
    check_types(r)
    assert r["error_class"] == "connect" and r["status"] is None and r["replica"] is None


def test_connect_timeout_through_send_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    # a SYN that is never answered, without depending on the accept-queue behaviour of a kernel
    async def never(*a: Any, **kw: Any) -> Any:
        await asyncio.sleep(3600)

    monkeypatch.setattr(asyncio.BaseEventLoop, "create_connection", never)
    (r,) = attempt("http://127.0.0.1:9", connect_timeout_s=0.2)
    assert r["error_class"] == "timeout_connect" and r["status"] is None, r["error"]
    assert 0.19 <= r["end_at"] - r["sent_at"] < 0.6


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def canned(reply: bytes, close: bool = True, tls: ssl.SSLContext | None = None) -> Handler:
    """A connection handler: read one request (head + Content-Length body), write ``reply``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(reply)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return handle


def against(handler: Handler, n: int = 1, tls: ssl.SSLContext | None = None,
            client_tls: ssl.SSLContext | None = None) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
    """Run ``n`` sequential raw attempts against a one-off server; returns records, connections."""

    async def go() -> tuple[list[dict[str, Any]], int]:
        srv = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=tls)
        port = srv.sockets[0].getsockname()[1]
        scheme = "https" if tls else "http"
        spec = LoadSpec(url=f"{scheme}://localhost:{port}", transport="raw", timeout_s=2.0,
                        api="completions", headers={"Authorization": "Bearer x"})  # fmt: skip
        try:
            async with RawSession(spec, ssl_context=client_tls) as s:
                recs = [await send_attempt(s, spec, b"{}", f"r{i}") for i in range(n)]
                return recs, s.connections_made
        finally:
            srv.close()

    return asyncio.run(go())


def test_framings_content_length_until_close_and_keepalive() -> None:
    cl = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(SSE_OK), SSE_OK)
    recs, conns = against(canned(cl, close=False), n=2)
    assert [r["ok"] for r in recs] == [True, True] and conns == 1
    assert recs[0]["output_tokens"] == 2 and recs[0]["text_len"] == 4
    eof = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + SSE_OK
    recs, conns = against(canned(eof), n=2)  # body until EOF; each request a new connection
    assert [r["ok"] for r in recs] == [True, True] and conns == 2


@pytest.mark.parametrize(
    "reply,cls,status",
    [
        (b"HTTP/1.1 2x0 OK\r\n\r\n", "garbled", None),  # bad status line
        (b"NOT HTTP AT ALL\r\n\r\n", "garbled", None),
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\nxx",
            "garbled",
            200,
        ),  # fmt: skip
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "reset", 200),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n" + SSE_OK[:40], "reset", 200),
        # a broken chunk after [DONE]: the reply was complete (as on the aiohttp path)
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\nzz\r\n"
            % (len(SSE_OK), SSE_OK),
            None,
            200,
        ),  # fmt: skip
        (b"HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n", "http_4xx", 302),
        (b"HTTP/1.1 429 Too Many\r\nContent-Length: 4\r\n\r\nslow", "http_429", 429),
        (b"", "reset", None),
    ],
)
def test_malformed_and_status_replies(reply: bytes, cls: str | None, status: int | None) -> None:
    (r,), _ = against(canned(reply))
    check_types(r)
    assert (r["error_class"], r["status"]) == (cls, status), r["error"]
    if cls == "http_429":
        assert r["error"] == "HTTP 429: slow"


def test_tls_verified_and_refused(tmp_path: Path) -> None:
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key),
         "-out", str(crt)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    srv_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    srv_ctx.load_cert_chain(crt, key)
    trust = ssl.create_default_context(cafile=str(crt))
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(SSE_OK), SSE_OK)
    (r,), _ = against(canned(reply), tls=srv_ctx, client_tls=trust)
    assert r["ok"] and r["output_tokens"] == 2, r["error"]
    (r,), _ = against(canned(reply), tls=srv_ctx)  # default context: self-signed is refused
    assert r["error_class"] == "connect" and "CERTIFICATE" in r["error"].upper(), r["error"]


def test_run_load_raw_and_validation(server: FakeServer, tmp_path: Path) -> None:
    spec = LoadSpec(url=server.url + "/mode=ok,tokens=4", rate_rps=200, duration_s=0.5,
                    seed=3, transport="raw")  # fmt: skip
    summary = run_load_blocking(spec, tmp_path / "r.jsonl")
    recs = list(read_records(tmp_path / "r.jsonl"))
    assert summary["sent"] == len(recs) == summary["ok"] > 50
    assert all(r["ok"] and r["output_tokens"] == 4 for r in recs)
    with pytest.raises(ValueError, match="transport"):
        LoadSpec(url=server.url, transport="h2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid HTTP header"):
        RawSession(LoadSpec(url=server.url, headers={"X-A": "1\r\nX-B: 2"}))
