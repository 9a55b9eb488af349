"""A tiny OpenAI-compatible SSE server that misbehaves on request, for tests and benchmarks.

Not the lab engine (``chaoslib_infer.lab.engine``): it has no queue, no model and no ledger. Its
behaviour is chosen per request by a path prefix before ``/v1/...``, a comma-separated list of
``key=value`` options, so a client pointed at ``http://HOST:PORT/mode=reset,k=3`` gets that mode.

Options (defaults in brackets):

* ``mode`` [``ok``]: ``ok`` normal stream; ``http`` answer ``status`` with a JSON error body;
  ``empty`` 200 with an empty body; ``nocontent`` role, finish and ``[DONE]`` but no output;
  ``garbled`` invalid UTF-8 inside a content chunk; ``badjson`` an event that is not JSON;
  ``fffd`` a U+FFFD escape in the content; ``truncated`` clean EOF before finish and ``[DONE]``;
  ``nodone`` finish but no ``[DONE]``; ``reset`` abort the connection after ``k`` content chunks;
  ``error`` an error object inside the 200 stream after ``k`` chunks; ``stall`` send ``k`` chunks
  then go silent; ``hang`` send the whole stream then keep the connection open; ``drop`` close the
  connection without any response; ``notsse`` 200 with a JSON error body.
* ``tokens`` [8]: content chunks; ``itl`` [0]: seconds between chunks (0 = one write);
  ``delay`` [0]: seconds before the response headers; ``status`` [503]; ``k`` [2];
  ``split`` [0]: when > 0, write the body in pieces of that many bytes; ``text`` [``tok``]: content
  of each chunk (``cjk`` = CJK characters); ``usage`` [1]: send a usage chunk when asked.
* ``fail`` [unset]: when set to N, only the first N requests carrying a given ``X-Request-Id``
  get ``mode``; later ones (retries) get a normal stream (``mode=ok``). For retry tests.

Every response carries ``X-Replica-Id`` (the server's ``replica``) and echoes ``X-Request-Id``.
``FakeServer.arrivals`` lists ``(request_id, time.perf_counter())`` of every request received,
``FakeServer.request_headers`` the headers of each (names lower-cased).
Run standalone: ``python -m chaoslib_infer.load.fakeserver [--port P]`` (prints the port).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from typing import Any

from aiohttp import web

__all__ = ["FakeServer", "stream_bytes"]


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def _opts(prefix: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for seg in prefix.strip("/").split("/"):
        for part in seg.split(","):
            if "=" in part:
                k, v = part.split("=", 1)
                out[k] = v
    return out


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def stream_bytes(
    api: str = "chat",
    tokens: int = 8,
    text: str = "tok",
    usage: bool = True,
    finish: bool = True,
    done: bool = True,
) -> list[bytes]:
    """The SSE events (bytes) of a normal OpenAI stream, one list item per event."""
    out: list[bytes] = []
    base: dict[str, Any] = {"id": "cmpl-1", "model": "fake", "created": 0}
    if api == "chat":
        base["object"] = "chat.completion.chunk"
        out.append(_event({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        for _ in range(tokens):
            ch = {"index": 0, "delta": {"content": text}, "finish_reason": None}
            out.append(_event({**base, "choices": [ch]}))
        if finish:
            ch = {"index": 0, "delta": {}, "finish_reason": "length"}
            out.append(_event({**base, "choices": [ch]}))
    else:
        base["object"] = "text_completion"
        for _ in range(tokens):
            out.append(_event({**base, "choices": [{"index": 0, "text": text}]}))
        if finish:
            ch = {"index": 0, "text": "", "finish_reason": "length"}
            out.append(_event({**base, "choices": [ch]}))
    if usage and finish:
        u = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}
        out.append(_event({**base, "choices": [], "usage": u}))
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


class FakeServer:
    """The fake server on 127.0.0.1, in a background thread with its own event loop.

    Use as a context manager (``with FakeServer() as srv: srv.url``). ``port=0`` picks a free port.
    """

    def __init__(self, port: int = 0, replica: str = "fake0", host: str = "127.0.0.1"):
        self.host = host
        self.port = port
        self.replica = replica
        self.requests = 0
        self.request_ids: list[str] = []
        self.request_headers: list[dict[str, str]] = []
        self.prompts: list[str] = []
        self.arrivals: list[tuple[str, float]] = []
        self._seen: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123``."""
        return f"http://{self.host}:{self.port}"

    def app(self) -> web.Application:
        """The aiohttp application (usable with any runner)."""
        app = web.Application()
        app.router.add_post(r"/{prefix:.*}v1/chat/completions", self._chat)
        app.router.add_post(r"/{prefix:.*}v1/completions", self._completions)
        return app

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completions")

    async def _handle(self, request: web.Request, api: str) -> web.StreamResponse:
        self.requests += 1
        rid = request.headers.get("X-Request-Id", "none")
        self.request_ids.append(rid)
        self.request_headers.append({k.lower(): v for k, v in request.headers.items()})
        self.arrivals.append((rid, time.perf_counter()))
        self._seen[rid] = self._seen.get(rid, 0) + 1
        o = _opts(request.match_info.get("prefix", ""))
        mode = o.get("mode", "ok")
        if "fail" in o and self._seen[rid] > int(o["fail"]):
            mode = "ok"
        tokens = int(o.get("tokens", "8"))
        itl = float(o.get("itl", "0"))
        k = int(o.get("k", "2"))
        split = int(o.get("split", "0"))
        text = o.get("text", "tok")
        if text == "cjk":
            text = "你好世界"
        try:
            body = await request.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        msgs = body.get("messages")
        if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict):
            self.prompts.append(str(msgs[0].get("content", "")))
        elif "prompt" in body:
            self.prompts.append(str(body["prompt"]))
        want_usage = (
            bool((body.get("stream_options") or {}).get("include_usage"))
            and o.get("usage", "1") == "1"
        )
        headers = {"X-Replica-Id": self.replica, "X-Request-Id": rid}
        delay = float(o.get("delay", "0"))
        if delay:
            await asyncio.sleep(delay)
        if mode == "drop":
            if request.transport is not None:
                request.transport.close()
            await asyncio.sleep(0.05)
            return web.Response(status=500)
        if mode == "http":
            st = int(o.get("status", "503"))
            err = {"error": {"message": f"fake status {st}", "type": "fake", "code": st}}
            return web.json_response(err, status=st, headers=headers)
        if mode == "notsse":
            return web.json_response({"error": {"message": "not a stream"}}, headers=headers)
        resp = web.StreamResponse(status=200, headers=headers)
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        if mode == "empty":
            await resp.write_eof()
            return resp
        finish = mode not in ("truncated", "nocontent_trunc")
        done = mode not in ("truncated", "nodone")
        events = stream_bytes(
            api, 0 if mode == "nocontent" else tokens, text, want_usage, finish, done
        )
        first = 1 if api == "chat" else 0  # index of the first content event
        if mode == "garbled":
            events[first + min(k, tokens - 1)] = (
                b'data: {"choices":[{"delta":{"content":"\xff\xfe"}}]}\n\n'
            )
        elif mode == "badjson":
            events[first + min(k, tokens - 1)] = b'data: {"choices": [{"delta": \n\n'
        elif mode == "fffd":
            events[first + min(k, tokens - 1)] = (
                b'data: {"choices":[{"index":0,"delta":{"content":"a\\ufffd"}}]}\n\n'
            )
        elif mode == "error":
            err = {"error": {"message": "fake in-stream error", "code": 500}}
            events = events[: first + k] + [_event(err)]
        elif mode in ("reset", "stall"):
            events = events[: first + k]
        if itl <= 0 and split <= 0:
            await resp.write(b"".join(events))
        else:
            for ev in events:
                if split > 0:
                    for i in range(0, len(ev), split):
                        await resp.write(ev[i : i + split])
                        await asyncio.sleep(0)
                else:
                    await resp.write(ev)
                if itl > 0:
                    await asyncio.sleep(itl)
        if mode == "reset":
            await asyncio.sleep(0.01)
            if request.transport is not None:
                request.transport.abort()
            return resp
        if mode in ("stall", "hang"):
            await asyncio.sleep(3600)
        await resp.write_eof()
        return resp

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock, backlog=1024)
        await site.start()
        self._ready.set()
        await self._stop.wait()
        await self._runner.cleanup()

    def start(self) -> FakeServer:
        """Start the server thread; returns when it is listening."""

        def target() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve())
            finally:
                loop.close()

        self._thread = threading.Thread(target=target, name="fake-sse-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def stop(self) -> None:
        """Stop the server and join its thread; idempotent."""
        if self._loop is not None and self._stop is not None and self._thread is not None:
            stop = self._stop
            self._loop.call_soon_threadsafe(stop.set)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Serve in the foreground (uvloop when available); prints ``PORT`` once listening."""
    ap = argparse.ArgumentParser(prog="python -m chaoslib_infer.load.fakeserver")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--replica", default="fake0")
    args = ap.parse_args(argv)
    srv = FakeServer(args.port, args.replica, args.host)

    async def run() -> None:
        runner = web.AppRunner(srv.app(), access_log=None)
        await runner.setup()
        sock = _bind(args.host, args.port)
        port = sock.getsockname()[1]
        await web.SockSite(runner, sock, backlog=1024).start()
        print(port, flush=True)
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.run(run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
