"""Simulated OpenAI-compatible inference engine for the lab, shaped like vLLM.

A single-process Starlette app served by uvicorn (uvloop + httptools) that imitates what
chaos drills observe on a real vLLM replica:

* ``POST /v1/chat/completions`` and ``POST /v1/completions`` (streaming SSE and non-streaming),
  ``GET /v1/models``, ``GET /health`` (503 while "loading weights") and ``GET /metrics``
  (prometheus_client, vLLM metric names, private registry, ``model_name`` label).
* Timing model: weight-load delay, a decaying warm-up penalty on the first requests, prefill time
  proportional to prompt tokens, and a fixed inter-token latency paced to absolute deadlines (no
  drift). Continuous batching: at most ``max_num_seqs`` sequences run; the rest wait in a bounded
  FIFO queue; when it is full the request is refused at once (429 or 503).
* Memory: each running sequence holds real, touched bytes for its KV cache
  (``kv_bytes_per_token`` per prompt + generated token, allocated in 16-token blocks like paged
  attention), freed when the sequence ends or the client disconnects, so a cgroup memory limit
  produces a real kernel OOM kill under long contexts.
* Ledger: one JSON line per generation started (ground truth for served requests / duplicates).
* Fault modes (lab-only, see "Fault modes" below): ``hang``, ``reset_after_k``, ``stall``,
  ``error_in_stream``, ``empty``, ``garbled``, ``truncated``, ``slowdown``,
  ``crash_on_long_prompt``; set at run time through ``POST /admin/faults`` or per request with the
  ``X-Chaos-Fault`` header. Every sabotaged request gets a ``"event": "fault"`` ledger line.
  Who may arm them: loopback peers, or, when the engine is started with ``--admin-token-file``
  (as the lab starts every sim replica), only a caller presenting that token.

Prompt tokens are approximated as ``max(1, ceil(len(text) / 4))`` characters-per-token over the
concatenated message contents (chat) or the prompt string (completions); a prompt given as a list
of token ids counts one token per id.

Run: ``python -m chaoslib_infer.lab.engine --port 8000 --replica-id r0`` (see ``--help``).

Modules (a package since issue #12; these names are re-exported here, where the lab, the tests
and the benchmarks import them): ``wire`` (ASGI shapes, error objects; a leaf), ``config``
(:class:`EngineConfig`), ``tokens`` (token counting and output text), ``faults`` (fault modes,
their parsing and who may arm them), ``sabotage`` (resets and hung requests), ``metrics``
(Prometheus exposition), ``scheduler`` (continuous batching), ``jobs`` (request bodies),
``state`` (one replica's shared state, ledger, KV bytes), ``generation`` (the streamed or whole
reply), ``app`` (HTTP routes), ``command`` (the command line; ``__main__`` runs it).
"""

from chaoslib_infer.lab.engine.app import build_app
from chaoslib_infer.lab.engine.command import check_args, main, parse_args
from chaoslib_infer.lab.engine.config import EngineConfig
from chaoslib_infer.lab.engine.faults import (
    ADMIN_TOKEN_HEADER,
    CRASH_EXIT_CODE,
    FAULT_HEADER,
    FAULT_MODES,
    FAULT_PARAMS,
    FaultSpec,
    admin_allowed,
    parse_fault,
    parse_fault_header,
)
from chaoslib_infer.lab.engine.state import KV_BLOCK_TOKENS
from chaoslib_infer.lab.engine.tokens import count_text_tokens, generate_tokens
from chaoslib_infer.lab.engine.wire import (
    ASGIApp,
    Message,
    Receive,
    RequestError,
    Scope,
    Send,
    error_body,
)

__all__ = [
    "ADMIN_TOKEN_HEADER",
    "ASGIApp",
    "CRASH_EXIT_CODE",
    "FAULT_HEADER",
    "FAULT_MODES",
    "FAULT_PARAMS",
    "KV_BLOCK_TOKENS",
    "EngineConfig",
    "FaultSpec",
    "Message",
    "Receive",
    "RequestError",
    "Scope",
    "Send",
    "admin_allowed",
    "build_app",
    "check_args",
    "count_text_tokens",
    "error_body",
    "generate_tokens",
    "main",
    "parse_args",
    "parse_fault",
    "parse_fault_header",
]
