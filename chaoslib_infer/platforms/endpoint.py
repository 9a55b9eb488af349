"""A managed (or any OpenAI-compatible) inference endpoint as a certification target.

Nothing here touches the provider's machines: the only faults are on **our** side of the wire
(network jitter injected in this client's own transport, :class:`JitterProxy`; client timeouts
with retries; a burst of our own traffic), so a hosted API (Volcano Engine Ark, an OpenAI-compatible vendor) can be
certified with nothing but an API key. Because every fault lives in this process, there is
nothing to roll back: the jitter stops when the run (or the process) stops.

Target file (YAML)::

    name: ark-prod                     # optional; default the file name; letters, digits, . _ -
    profile: ark                       # vllm | sglang | tgi | trtllm | ark | openai
    url: https://ark.cn-beijing.volces.com/api/v3   # base URL (optional for ark: this default)
    model: ep-20250101-abcde           # model name / Ark endpoint id
    api_key_env: ARK_API_KEY           # the key's environment variable, or
    # api_key_file: ~/.ark-key         # a file whose first line is the key
    price:                             # optional: per 1M tokens, for cost per request
      input_per_1m: 0.8
      output_per_1m: 2.0
      currency: CNY
    include_usage: true                # optional; default: what the profile accepts
    extra_body: {}                     # optional JSON fields merged into every request body

The key is never written anywhere: it is read into memory, sent only in the profile's auth
header, and every file the certification writes is scrubbed of it afterwards
(``chaoslib_infer.safety.redact``). A key inline in the file (``api_key:``) is refused. The URL
must match the target allowlist (loopback by default; ``--allow``, ``CHAOS_INFER_ALLOW``).

:class:`JitterProxy` lives in :mod:`chaoslib_infer.platforms.jitter_proxy` and is re-exported here.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chaoslib_infer.errors import ConfigError
from chaoslib_infer.platforms.jitter_proxy import JitterProxy as JitterProxy
from chaoslib_infer.providers import Profile, auth_headers, endpoint, get_profile, join
from chaoslib_infer.safety.redact import clip

__all__ = [
    "EndpointTarget",
    "JitterProxy",
    "load_target",
    "probe_target",
]

_KEYS = {
    "name",
    "profile",
    "url",
    "model",
    "api_key_env",
    "api_key_file",
    "price",
    "include_usage",
    "extra_body",
}
_PRICE_KEYS = {"input_per_1m", "output_per_1m", "currency"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass
class EndpointTarget:
    """A validated target (module docstring). ``key`` is kept out of ``repr`` and of
    :meth:`describe`.

    Attributes:
        name: short name (folder of its evidence).
        profile: the provider profile.
        url: base URL.
        model: model name / endpoint id sent in every request.
        key_source: where the key comes from, for the report (``$ENV`` or ``file PATH``).
        price: ``{"input_per_1m", "output_per_1m", "currency"}`` or None.
        include_usage: send ``stream_options.include_usage``.
        extra_body: extra JSON fields for every request.
        source: the target file.
        key: the API key (never written anywhere).
    """

    name: str
    profile: Profile
    url: str
    model: str
    key_source: str | None = None
    price: dict[str, Any] | None = None
    include_usage: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    source: str = "<target>"
    key: str | None = field(default=None, repr=False)

    @property
    def chat_url(self) -> str:
        """Full URL of the chat completions route."""
        return endpoint(self.profile, self.url)

    def headers(self) -> dict[str, str]:
        """Request headers: the profile's auth header when a key is set."""
        return auth_headers(self.profile, self.key)

    def describe(self) -> dict[str, Any]:
        """JSON-able description for the evidence (no key, only where it came from)."""
        return {
            "name": self.name,
            "profile": self.profile.name,
            "profile_title": self.profile.title,
            "url": self.url,
            "chat_url": self.chat_url,
            "model": self.model,
            "auth": (
                f"{self.profile.auth_header}: {self.profile.auth_scheme} <key from "
                f"{self.key_source}>"
                if self.key
                else "none"
            ),
            "price": self.price,
            "include_usage": self.include_usage,
            "managed": self.profile.managed,
            "source": self.source,
        }


def _bad(source: str, msg: str) -> ConfigError:
    return ConfigError(f"{source}: {msg}")


def _price(raw: Any, source: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _bad(source, "price: expected a mapping with input_per_1m / output_per_1m")
    unknown = sorted(set(raw) - _PRICE_KEYS)
    if unknown:
        raise _bad(
            source, f"price: unknown field {unknown[0]!r} (known: {', '.join(sorted(_PRICE_KEYS))})"
        )
    out: dict[str, Any] = {"currency": str(raw.get("currency") or "USD")}
    for k in ("input_per_1m", "output_per_1m"):
        v = raw.get(k, 0.0)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise _bad(source, f"price.{k}: expected a number >= 0, got {v!r}")
        out[k] = float(v)
    return out


def _key(doc: dict[str, Any], source: str) -> tuple[str | None, str | None]:
    from chaoslib_infer.safety.redact import MIN_SECRET_LEN, read_key_file

    env, path = doc.get("api_key_env"), doc.get("api_key_file")
    if env and path:
        raise _bad(source, "give api_key_env or api_key_file, not both")
    if env:
        if not isinstance(env, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env):
            raise _bad(source, f"api_key_env: expected an environment variable name, got {env!r}")
        key = os.environ.get(env, "").strip()
        if len(key) < MIN_SECRET_LEN:
            raise _bad(
                source,
                f"api_key_env: ${env} is not set (or shorter than {MIN_SECRET_LEN} characters)",
            )
        return key, f"${env}"
    if path:
        if not isinstance(path, str):
            raise _bad(source, f"api_key_file: expected a path, got {path!r}")
        p = Path(path).expanduser()
        if not p.is_absolute():
            p = Path(source).parent / p
        try:
            return read_key_file(p), f"file {p}"
        except ValueError as exc:
            raise _bad(source, str(exc)) from None
    return None, None


def load_target(path: str | Path, allow: tuple[str, ...] | list[str] = ()) -> EndpointTarget:
    """Read, validate and allowlist-check a target file (module docstring).

    Args:
        path: the YAML file.
        allow: extra allowlist patterns (``--allow``).

    Returns:
        The target, key loaded.

    Raises:
        ConfigError: unreadable file, unknown or malformed field, a key inline in the file, a
            key variable or file that is missing, a URL outside the allowlist (one line naming
            the file and the field).
    """
    from chaoslib_infer.safety.allowlist import check_target

    source = str(path)
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read target file {source}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{source}: not valid YAML{where}") from None
    if not isinstance(doc, dict):
        raise _bad(source, "expected a mapping with at least profile, url and model")
    if "api_key" in doc:
        raise _bad(
            source, "api_key: never put the key in the target file; use api_key_env or api_key_file"
        )
    unknown = sorted(set(doc) - _KEYS, key=str)
    if unknown:
        raise _bad(source, f"unknown field {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    try:
        profile = get_profile(str(doc.get("profile") or ""))
    except KeyError as exc:
        raise _bad(source, f"profile: {exc.args[0]}") from None
    url = doc.get("url") or profile.default_base_url
    if not isinstance(url, str) or not url:
        raise _bad(source, "missing required field 'url'")
    if not re.match(r"^https?://[^/\s]+", url):
        raise _bad(source, f"url: expected http(s)://host[:port][/path], got {url!r}")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise _bad(source, f"missing required field 'model' ({profile.model_note})")
    name = doc.get("name") or Path(path).stem
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(
            source, f"name: expected letters, digits, '.', '_' or '-' (max 64), got {name!r}"
        )
    include_usage = doc.get("include_usage", profile.accepts_include_usage)
    if not isinstance(include_usage, bool):
        raise _bad(source, f"include_usage: expected true or false, got {include_usage!r}")
    extra = doc.get("extra_body") or {}
    if not isinstance(extra, dict):
        raise _bad(source, "extra_body: expected a mapping")
    price = _price(doc.get("price"), source)
    try:
        check_target(url, tuple(allow))
    except ConfigError as exc:
        raise _bad(source, str(exc)) from None
    key, key_source = _key(doc, source)
    return EndpointTarget(
        name=name,
        profile=profile,
        url=url.rstrip("/"),
        model=model,
        key_source=key_source,
        price=price,
        include_usage=include_usage,
        extra_body=dict(extra),
        source=source,
        key=key,
    )


def _events(raw: bytes) -> list[dict[str, Any]]:
    from chaoslib_infer.measure.sse import SSEDecoder

    dec = SSEDecoder()
    out = []
    for ev in dec.feed(raw) + dec.close():
        try:
            obj = json.loads(ev.data)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _role_chunk(events: list[dict[str, Any]]) -> str | None:
    """How the first chat chunk carries the role: ``role``, ``role+empty`` or ``none``."""
    for obj in events:
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            continue
        delta = choices[0].get("delta") if isinstance(choices[0], dict) else None
        if not isinstance(delta, dict):
            return None
        content = delta.get("content")
        if delta.get("role") and not content:
            return "role+empty" if content == "" else "role"
        return "none"
    return None


async def _post(session: Any, url: str, body: dict[str, Any], headers: Mapping[str, str],
                timeout_s: float) -> tuple[int | None, bytes, str | None]:  # fmt: skip
    import aiohttp

    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=json.dumps(body).encode(), headers=dict(headers),
                                    allow_redirects=False) as resp:  # fmt: skip
                return resp.status, await resp.read(), None
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return None, b"", clip(f"{type(exc).__name__}: {exc}", 300)


async def _get(session: Any, url: str, headers: Mapping[str, str], timeout_s: float) -> int | None:
    import aiohttp

    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url, headers=dict(headers), allow_redirects=False) as resp:
                await resp.read()
                return resp.status
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


def _row(check: str, expected: str, observed: str, passed: bool | None, critical: bool = False
         ) -> dict[str, Any]:  # fmt: skip
    return {"check": check, "expected": expected, "observed": observed, "passed": passed,
            "critical": critical}  # fmt: skip


async def _probe(target: EndpointTarget, timeout_s: float) -> dict[str, Any]:
    import aiohttp

    from chaoslib_infer.measure.sse import StreamParser
    from chaoslib_infer.providers import parse_error

    p = target.profile
    url = target.chat_url
    auth = target.headers()
    words = "alpha bravo charlie delta echo foxtrot golf hotel".split()

    def body(n_words: int, stream: bool = True, usage: bool | None = None) -> dict[str, Any]:
        text = " ".join(words[i % len(words)] for i in range(n_words))
        b: dict[str, Any] = {
            "model": target.model,
            "messages": [{"role": "user", "content": f"[{os.urandom(8).hex()}] {text}"}],
            "max_tokens": 8,
            "stream": stream,
        }
        if stream and (target.include_usage if usage is None else usage):
            b["stream_options"] = {"include_usage": True}
        b.update(target.extra_body)
        return b

    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"rows": rows, "include_usage": target.include_usage}
    conn = aiohttp.TCPConnector(limit=4)
    async with aiohttp.ClientSession(connector=conn, trust_env=False) as session:
        hdrs = {"Content-Type": "application/json", **auth}
        status, raw, err = await _post(session, url, body(16), hdrs, timeout_s)
        if status is None:
            out["unreachable"] = f"{url}: {err}"
            return out
        if status in (401, 403):
            out["refused"] = (
                f"{url} answered {status} (check the key: {target.key_source or 'none given'})"
            )
            return out
        if status == 404:
            out["refused"] = (
                f"{url} answered 404 ({parse_error(raw).get('message') or 'not found'}): check "
                f"url, profile ({p.name}) and model ({p.model_note})"
            )
            return out
        if 400 <= status < 500 and target.include_usage:
            s2, raw2, _ = await _post(session, url, body(16, usage=False), hdrs, timeout_s)
            if s2 == 200:
                out["include_usage"] = False
                rows.append(_row("stream_options accepted", "include_usage accepted",
                                 f"{status} with it, 200 without: disabled for this target",
                                 False))  # fmt: skip
                status, raw = s2, raw2
        parser = StreamParser()
        parser.feed(raw)
        parser.close()
        cls, msg = parser.classify() if status == 200 else (f"http {status}", None)
        rows.append(_row("streaming chat completion", "200, SSE, finish reason, [DONE]",
                         f"{status}, {'clean' if cls is None else f'{cls}: {msg}'}",
                         status == 200 and cls is None, critical=True))  # fmt: skip
        events = _events(raw) if status == 200 else []
        role = _role_chunk(events)
        rows.append(_row("first chat chunk", p.role_chunk, role or "-",
                         None if role is None else role == p.role_chunk))  # fmt: skip
        if out["include_usage"]:
            rows.append(_row("usage in stream", "usage.completion_tokens",
                             "present" if parser.usage_tokens is not None else "absent",
                             parser.usage_tokens is not None))  # fmt: skip
        # input tokens per prompt word (a + b * words), from the usage of two prompt sizes
        fit: dict[str, Any] = {}
        for n in (16, 256):
            s, r, _ = await _post(session, url, body(n, stream=False), hdrs, timeout_s)
            try:
                usage = json.loads(r).get("usage") or {}
                fit[str(n)] = int(usage["prompt_tokens"]) if s == 200 else None
            except (ValueError, KeyError, TypeError, AttributeError):
                fit[str(n)] = None
        if fit.get("16") is not None and fit.get("256") is not None:
            slope = (fit["256"] - fit["16"]) / 240.0
            out["input_tokens"] = {"per_word": slope, "base": fit["16"] - 16 * slope,
                                   "observed": fit}  # fmt: skip
        s, r, _ = await _post(
            session, url, {"model": target.model, "messages": []}, hdrs, timeout_s
        )
        if s is not None and s >= 400:
            shape = parse_error(r)
            rows.append(_row("error body shape", p.error_shape,
                             clip(f"{s} {shape['shape']}: {shape['message']}", 200),
                             shape["shape"] == p.error_shape))  # fmt: skip
        else:
            rows.append(_row("error body shape", p.error_shape, f"{s}: not exercised", None))
        if target.key and p.unauthorized is not None:
            s, r, _ = await _post(session, url, body(4), {"Content-Type": "application/json"},
                                  timeout_s)  # fmt: skip
            rows.append(_row("key enforced", f"{p.unauthorized[0]} without the key", str(s),
                             s == p.unauthorized[0]))  # fmt: skip
        for path in p.health_paths:
            s2 = await _get(session, join(p, target.url, path), {}, timeout_s)
            rows.append(_row(f"health {path}", "200", str(s2), s2 == 200))
        if p.models_path:
            s2 = await _get(session, join(p, target.url, p.models_path), auth, timeout_s)
            rows.append(_row(f"models {p.models_path}", "200", str(s2), s2 == 200))
    return out


def probe_target(target: EndpointTarget, timeout_s: float = 30.0) -> dict[str, Any]:
    """Check that ``target`` answers like its profile (a handful of small requests).

    Checks: a streaming chat completion parses cleanly (critical), the first chunk's role
    convention, usage in the stream (when requested; a 4xx with ``stream_options`` and a 200
    without turns it off for this target), the error body shape of a bad request, the key being
    enforced (a request without it), health and model routes. Two non-streaming requests of 16
    and 256 prompt words give the target's input tokens per word (for cost per request).

    Args:
        target: the target.
        timeout_s: per request, seconds.

    Returns:
        ``{"rows": [{"check", "expected", "observed", "passed", "critical"}], "include_usage",
        "input_tokens": {"per_word", "base", "observed"} (when usage was reported),
        "conformant": every judged row passed, "usable": every critical row passed}``, plus
        ``"unreachable"`` (no connection) or ``"refused"`` (401/403/404 on the chat route) with a
        one-line reason, when the target cannot be certified at all.
    """
    from chaoslib_infer.load.client import new_loop

    with asyncio.Runner(loop_factory=new_loop) as runner:
        out = runner.run(_probe(target, timeout_s))
    rows = out["rows"]
    out["conformant"] = all(r["passed"] is not False for r in rows) and bool(rows)
    out["usable"] = bool(rows) and all(r["passed"] for r in rows if r["critical"])
    return out
