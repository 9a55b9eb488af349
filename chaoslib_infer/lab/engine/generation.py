"""The ASGI response that queues, generates and streams (or returns) one completion."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from chaoslib_infer.lab import kernel_stamps
from chaoslib_infer.lab.engine.faults import FaultSpec
from chaoslib_infer.lab.engine.jobs import Job
from chaoslib_infer.lab.engine.sabotage import AbortLogFilter, arm_reset
from chaoslib_infer.lab.engine.scheduler import Ticket
from chaoslib_infer.lab.engine.state import Engine, KvHold
from chaoslib_infer.lab.engine.tokens import generate_tokens
from chaoslib_infer.lab.engine.wire import Receive, Scope, Send, error_body, sse


def _chunk_templates(job: Job, model: str) -> tuple[str, str, str]:
    """(prefix, suffix, id) so a content chunk is ``prefix + json.dumps(token) + suffix``."""
    if job.chat:
        cid = f"chatcmpl-{job.request_id}"
        head = (
            f'{{"id":{json.dumps(cid)},"object":"chat.completion.chunk","created":{job.created},'
            f'"model":{json.dumps(model)},"choices":[{{"index":0,'
        )
        return head + '"delta":{"content":', '},"logprobs":null,"finish_reason":null}]}', cid
    cid = f"cmpl-{job.request_id}"
    head = (
        f'{{"id":{json.dumps(cid)},"object":"text_completion","created":{job.created},'
        f'"model":{json.dumps(model)},"choices":[{{"index":0,'
    )
    return head + '"text":', ',"logprobs":null,"finish_reason":null,"stop_reason":null}]}', cid


def _usage(job: Job, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": job.prompt_tokens + completion_tokens,
    }


class GenerationResponse:
    """ASGI response that queues, generates and streams (or returns) one completion.

    A watcher task listens for ``http.disconnect``; on disconnect the generation is cancelled and
    the KV bytes and the scheduler slot are freed. ``fault`` (optional) sabotages the reply: see
    ``faults``.
    """

    def __init__(
        self, engine: Engine, job: Job, ticket: Ticket, fault: FaultSpec | None = None
    ) -> None:
        self.engine = engine
        self.job = job
        self.ticket = ticket
        self.fault = fault
        self.mode = fault.mode if fault is not None else None
        self.itl_scale = engine.itl_scale(fault)
        self.disconnected = False
        self.stamps: kernel_stamps.Stamps | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.stamps = kernel_stamps.stamps_of(scope)

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    self.disconnected = True
                    task.cancel()
                    return

        watcher = asyncio.create_task(watch())
        try:
            if self.job.stream:
                await self._stream(send)
            else:
                await self._whole(send)
            if self.mode == "reset_after_k":
                arm_reset(scope)  # returning without completing: uvicorn closes -> RST
                AbortLogFilter.pending += 1
        except asyncio.CancelledError:
            if not self.disconnected:
                raise
            task.uncancel()
        finally:
            watcher.cancel()
            self.engine.scheduler.release(self.ticket)

    def _limit(self) -> int | None:
        """Tokens to generate when the fault cuts the reply short (None: all of them)."""
        if self.mode in ("reset_after_k", "truncated", "error_in_stream"):
            assert self.fault is not None
            return int(self.fault.params["k"])
        return 0 if self.mode == "empty" else None

    async def _generate(self, emit: Callable[[str], Awaitable[None]] | None) -> list[str]:
        """Wait for a slot, then produce the tokens on their deadlines; returns the tokens.

        Faults: ``stall`` shifts every deadline from token ``k`` on by ``t`` seconds; ``slowdown``
        scales the inter-token latency; a fault that cuts the reply stops after ``_limit()`` tokens.
        """
        eng, job, cfg = self.engine, self.job, self.engine.config
        limit = self._limit()
        n_tokens = job.max_tokens if limit is None else min(limit, job.max_tokens)
        itl = cfg.itl_s * self.itl_scale
        stall_at, stall_s = -1, 0.0
        if self.mode == "stall":
            assert self.fault is not None
            stall_at, stall_s = int(self.fault.params["k"]), float(self.fault.params["t"])
        await eng.scheduler.wait(self.ticket)
        loop = asyncio.get_running_loop()
        penalty = eng.record_generation(job.request_id)
        m = eng.metrics
        m.prompt_tokens.labels(cfg.model).inc(job.prompt_tokens)
        kv = KvHold(eng)
        produced: list[str] = []
        outcome = "error"
        try:
            kv.grow(job.prompt_tokens)
            t0 = loop.time()
            first = t0 + penalty + job.prompt_tokens * cfg.prefill_s_per_token
            last_t = 0.0
            for k, tok in enumerate(generate_tokens(job.request_id, n_tokens)):
                if k == stall_at:
                    first += stall_s  # this and every later deadline move by the stall
                    if cfg.zero_latency:
                        await asyncio.sleep(stall_s)
                if cfg.zero_latency:
                    await asyncio.sleep(0)
                else:
                    delay = first + k * itl - loop.time()
                    await asyncio.sleep(delay if delay > 0 else 0)
                kv.grow(1)
                produced.append(tok)
                if emit is not None:
                    await emit(tok)
                now = time.perf_counter()
                if k == 0:
                    m.ttft.labels(cfg.model).observe(now - job.arrival)
                    eng.record_ttft(job.request_id, now - job.arrival, self.stamps)
                else:
                    m.itl.labels(cfg.model).observe(now - last_t)
                last_t = now
            m.e2e.labels(cfg.model).observe(time.perf_counter() - job.arrival)
            if limit is None:
                reason = job.finish_reason
            else:
                reason = "stop" if self.mode == "empty" else "abort"
            m.success.labels(cfg.model, reason).inc()
            outcome = "done"
        except asyncio.CancelledError:
            outcome = "cancelled"
            if self.disconnected:
                m.success.labels(cfg.model, "abort").inc()
            raise
        finally:
            m.generation_tokens.labels(cfg.model).inc(len(produced))
            kv.release()
            eng.record_generation_end(job.request_id, job.prompt_tokens, len(produced), outcome)
        return produced

    def _garble_how(self, index: int) -> str | None:
        """How output token ``index`` is garbled (``"fffd"``/``"bytes"``), or None."""
        if self.mode != "garbled":
            return None
        assert self.fault is not None
        k, how = int(self.fault.params["k"]), str(self.fault.params["how"])
        if how == "both":
            return "fffd" if index == k else ("bytes" if index == k + 1 else None)
        return how if index == k else None

    def _fault_error(self) -> dict[str, Any]:
        assert self.fault is not None
        return error_body(500, f"engine fault injected ({self.fault.mode}): generation failed")

    async def _stream(self, send: Send) -> None:
        job, model = self.job, self.engine.config.model
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        prefix, suffix, cid = _chunk_templates(job, model)
        obj = "chat.completion.chunk" if job.chat else "text_completion"
        base = {"id": cid, "object": obj, "created": job.created, "model": model}
        if job.chat:
            role = {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant"},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            await send(sse(role))
        emitted = 0

        async def emit(tok: str) -> None:
            nonlocal emitted
            how = self._garble_how(emitted)
            emitted += 1
            if how is None:
                content = json.dumps(tok, ensure_ascii=False).encode()
            elif how == "fffd":  # a literal U+FFFD: the server itself produced a broken character
                content = json.dumps(tok + "\ufffd", ensure_ascii=False).encode()
            else:  # raw bytes that are not UTF-8 at all inside the JSON string
                content = json.dumps(tok, ensure_ascii=False).encode()[:-1] + b'\xff\xfe"'
            body = b"data: " + prefix.encode() + content + suffix.encode() + b"\n\n"
            await send({"type": "http.response.body", "body": body, "more_body": True})

        tokens = await self._generate(emit)
        if self.mode == "reset_after_k":
            return  # the caller aborts the connection
        if self.mode == "truncated":  # clean end of the HTTP body: no finish_reason, no [DONE]
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if self.mode == "error_in_stream":
            out = sse(self._fault_error())["body"] + b"data: [DONE]\n\n"
            await send({"type": "http.response.body", "body": out, "more_body": False})
            return
        finish = "stop" if self.mode == "empty" else job.finish_reason
        if job.chat:
            final_choice: dict[str, Any] = {
                "index": 0,
                "delta": {},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        else:
            final_choice = {
                "index": 0,
                "text": "",
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        out = sse({**base, "choices": [final_choice]})["body"]
        if job.include_usage:
            out += sse({**base, "choices": [], "usage": _usage(job, len(tokens))})["body"]
        out += b"data: [DONE]\n\n"
        await send({"type": "http.response.body", "body": out, "more_body": False})

    async def _whole(self, send: Send) -> None:
        job, model = self.job, self.engine.config.model
        tokens = await self._generate(None)
        garble = [self._garble_how(i) for i in range(len(tokens))]
        marks = {"fffd": "\ufffd", "bytes": "\x00GARBLED\x00"}
        text = "".join(tok + marks[g] if g else tok for tok, g in zip(tokens, garble, strict=True))
        finish: str | None = "stop" if self.mode == "empty" else job.finish_reason
        if self.mode == "truncated":
            finish = None
        choice: dict[str, Any]
        if job.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        body = {
            "id": f"chatcmpl-{job.request_id}" if job.chat else f"cmpl-{job.request_id}",
            "object": "chat.completion" if job.chat else "text_completion",
            "created": job.created,
            "model": model,
            "choices": [choice],
            "usage": _usage(job, len(tokens)),
        }
        if self.mode == "error_in_stream":  # a 200 whose body is an error object
            body = self._fault_error()
        payload = json.dumps(body, ensure_ascii=False).encode()
        payload = payload.replace(b"\\u0000GARBLED\\u0000", b"\xff\xfe")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        if self.mode == "reset_after_k":  # half the body, then the caller aborts the connection
            half = payload[: len(payload) // 2]
            await send({"type": "http.response.body", "body": half, "more_body": True})
            return
        await send({"type": "http.response.body", "body": payload, "more_body": False})
