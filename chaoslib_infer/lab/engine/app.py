"""The engine's HTTP routes (Starlette app) and its response-header middleware."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chaoslib_infer.lab.engine.config import EngineConfig
from chaoslib_infer.lab.engine.errors import answer as provider_error_answer
from chaoslib_infer.lab.engine.faults import (
    ADMIN_TOKEN_HEADER,
    FAULT_HEADER,
    FAULT_MODES,
    FAULT_PARAMS,
    admin_allowed,
    parse_fault,
)
from chaoslib_infer.lab.engine.generation import GenerationResponse
from chaoslib_infer.lab.engine.jobs import parse_job
from chaoslib_infer.lab.engine.sabotage import ABORT_LOG_FILTER, HangResponse
from chaoslib_infer.lab.engine.state import Engine
from chaoslib_infer.lab.engine.wire import (
    ASGIApp,
    Message,
    Receive,
    RequestError,
    Scope,
    Send,
    error_response,
)


class HeadersMiddleware:
    """Adds ``X-Replica-Id`` and echoes/creates ``X-Request-Id`` on every HTTP response."""

    def __init__(self, app: ASGIApp, replica_id: str) -> None:
        self.app = app
        self.replica = replica_id.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = ""
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                rid = v.decode("latin-1")
                break
        if not rid:
            rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        extra = [(b"x-replica-id", self.replica), (b"x-request-id", rid.encode("latin-1"))]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_wrapper)


def build_app(config: EngineConfig) -> Starlette:
    """Build the engine's ASGI app.

    The simulated weight load starts when this is called (``load_delay_s`` from now).

    Args:
        config: engine configuration.

    Returns:
        A Starlette app; ``app.state.engine`` holds the engine state.

    Raises:
        OSError: when the ledger file cannot be opened.
    """
    engine = Engine(config)

    async def completions(request: Request, chat: bool) -> Any:
        if not engine.ready():
            return error_response(503, "model is loading")
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_response(400, f"invalid JSON body: {exc}")
        try:
            job = parse_job(body, chat, request.state.request_id, config)
            fault = None
            if config.admin_faults:
                header = request.headers.get(FAULT_HEADER)
                if header is not None and config.admin_token is not None:
                    denied = admin_allowed(
                        config, request.client, request.headers.get(ADMIN_TOKEN_HEADER)
                    )
                    if denied is not None:
                        raise RequestError(403, f"{FAULT_HEADER}: {denied}")
                fault = engine.choose_fault(header, job.prompt_tokens)
        except RequestError as exc:
            return error_response(exc.status, exc.message)
        if fault is not None and fault.mode == "http_error":  # answered now, never generated
            response, facts = provider_error_answer(fault, config.profile)
            engine.record_fault(
                fault, job.request_id, answer=facts, prompt_tokens=job.prompt_tokens
            )
            return response
        if fault is not None:
            engine.record_fault(fault, job.request_id, prompt_tokens=job.prompt_tokens)
            if fault.mode == "crash_on_long_prompt":
                engine.crash(fault, job.prompt_tokens)
            if fault.mode == "hang":  # engine loop dead: accepted, never answered
                return HangResponse(engine.hung, fault)
        ticket = engine.scheduler.try_admit()
        if ticket is None:
            return error_response(config.queue_full_status, "waiting queue is full")
        return GenerationResponse(engine, job, ticket, fault)

    async def chat_completions(request: Request) -> Any:
        return await completions(request, chat=True)

    async def text_completions(request: Request) -> Any:
        return await completions(request, chat=False)

    async def health(request: Request) -> Response:
        if engine.ready():
            return Response(status_code=200)
        return error_response(503, "model is loading")

    async def models(request: Request) -> Response:
        if not engine.ready():
            return error_response(503, "model is loading")
        card = {
            "id": config.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": config.model,
            "parent": None,
            "max_model_len": config.kv_cache_tokens,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics(request: Request) -> Response:
        data = generate_latest(engine.metrics.registry)
        return Response(data, media_type=CONTENT_TYPE_LATEST)

    async def admin_faults(request: Request) -> Response:
        # Lab-only endpoint (see ``faults``): the lab's token or loopback peers only, off
        # with --no-admin-faults.
        if not config.admin_faults:
            return error_response(404, "fault injection is disabled (--no-admin-faults)")
        denied = admin_allowed(config, request.client, request.headers.get(ADMIN_TOKEN_HEADER))
        if denied is not None:
            return error_response(403, denied)
        if request.method == "POST":
            try:
                fields = json.loads(await request.body())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                return error_response(400, f"invalid JSON body: {exc}")
            try:
                spec = parse_fault(fields)
            except RequestError as exc:
                return error_response(exc.status, exc.message)
            if isinstance(fields.get("seed"), int):
                engine.faults.rng.seed(fields["seed"])
            spec.served_at_set = engine.generations_started
            engine.faults.set(spec)
            engine.record_admin("set", [spec])
            try:
                engine.persist_faults()
            except OSError as exc:  # armed, but would not survive a restart: say so, disarm
                engine.faults.clear(spec.mode)
                return error_response(500, f"fault-state file not written: {exc}")
        elif request.method == "DELETE":
            mode = request.query_params.get("mode")
            if mode is not None:
                mode = mode.strip().lower().replace("-", "_")
                if mode not in FAULT_PARAMS:
                    return error_response(400, f"unknown fault mode {mode!r}")
            cleared = engine.faults.clear(mode)
            released = engine.release_hung() if mode in (None, "hang") else 0
            engine.record_admin("clear", cleared)
            try:
                engine.persist_faults()
            except OSError as exc:  # disarmed here, but a restart would re-arm it
                return error_response(500, f"fault-state file not rewritten: {exc}")
            return JSONResponse(
                {
                    "replica": config.replica_id,
                    "pid": os.getpid(),
                    "cleared": [f.to_json() for f in cleared],
                    "released_hung_requests": released,
                    "faults": [f.to_json() for f in engine.faults.active()],
                }
            )
        out: dict[str, Any] = {
            "replica": config.replica_id,
            "pid": os.getpid(),
            "faults": [f.to_json() for f in engine.faults.active()],
            "modes": list(FAULT_MODES),
        }
        if request.method == "POST":
            out["fault"] = spec.to_json()
        return JSONResponse(out)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        engine.close()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", text_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/admin/faults", admin_faults, methods=["GET", "POST", "DELETE"]),
        ],
        lifespan=lifespan,
    )
    app.state.engine = engine
    logging.getLogger("uvicorn.error").addFilter(ABORT_LOG_FILTER)
    app.add_middleware(HeadersMiddleware, replica_id=config.replica_id)  # type: ignore[arg-type]
    from chaoslib_infer.lab.mimic import ENGINE_KEY_ENV, MimicMiddleware

    if config.profile is not None or os.environ.get(ENGINE_KEY_ENV):  # provider mimic mode
        app.add_middleware(
            MimicMiddleware,  # type: ignore[arg-type]
            profile=config.profile or "vllm",
            api_key=os.environ.get(ENGINE_KEY_ENV),
            model=config.model,
        )
    return app
