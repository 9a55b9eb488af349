"""Command line: ``python -m chaoslib_infer.load --url URL --rate RPS --duration-s S --out FILE``.

Retry policy (owned by the client, ``client.run_load``): ``--retry-attempts N`` (total attempts per
logical request, default 1), ``--retry-backoff-s S`` (0.2), ``--attempt-timeout-s S`` (default
``--timeout-s``), ``--retry-on a,b,c`` (error classes, default ``client.DEFAULT_RETRY_ON``),
``--idempotency-header NAME`` (the logical request id in that header too, same on every retry).
Prompt lengths: ``--prompt-words N`` (16) or a mix ``--prompt-mix short:70,mid:25,long:5``
(:mod:`chaoslib_infer.load.mix`). Client timeouts: ``--ttft-timeout-s`` (first token, 10),
``--idle-timeout-s`` (between chunks, 5), 0 for no limit; ``--timeout-s`` (total, 30).
Rate profile: ``--profile "10:8,15:24,15:8"`` (``duration_s:rate_rps`` phases); it replaces
``--rate`` and defines the duration; ``--duration-s``, when also given, is a hard bound that cuts
the profile.

Prints one progress line every 5 s to stderr (``sent, ok, failed, in flight, not sent``) and a
JSON summary line to stdout at the end. In-flight cap: ``--max-concurrency`` (default sized from
the plan, ``LoadSpec.cap``); a request due while it is full is recorded ``not_sent``, the schedule
never waits. SIGTERM/SIGINT: stop sending, cancel in-flight attempts (each recorded ``cut_off``:
outcome unknown), flush the records file, exit 0.
Exit 2 with one error line on bad arguments or an unwritable output file.
Beside the records file go Locust-format CSV stats (:mod:`chaoslib_infer.load.locuststats`:
``--out run/rec.jsonl`` gives ``run/rec_stats.csv``, ``rec_stats_history.csv``,
``rec_failures.csv``; named in the summary's ``locust_stats``), written after the records are
flushed, also after a SIGTERM; ``--no-locust-stats`` skips them. A CSV that cannot be written is
a warning on stderr, not a failure.
``$CHAOS_INFER_API_KEY``, when set, is sent as ``Authorization: Bearer`` (unless ``--header``
sets Authorization): the key stays off the command line.
Parent watchdog: when the process that started the generator dies (a SIGKILLed runner; the
generator runs in its own session, so no signal reaches it), ``os.getppid()`` changes; it is
polled every 0.2 s and stops the run like SIGTERM does (records flushed, exit 0).
(PR_SET_PDEATHSIG is not used: it fires when the spawning *thread* exits, and the runner starts
load from worker threads.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from chaoslib_infer.measure import chunkpath
from chaoslib_infer.safety.redact import env_key

_T = TypeVar("_T")

PROG = "python -m chaoslib_infer.load"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    p = _Parser(prog=PROG, description="Open-loop streaming load against an OpenAI-compatible URL.")
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8800")
    p.add_argument("--rate", type=float, help="mean arrival rate, requests/s")
    p.add_argument(
        "--duration-s", type=float, help="schedule length, seconds (with --profile: a hard bound)"
    )
    p.add_argument("--out", required=True, help="records file (JSONL), overwritten")
    p.add_argument(
        "--no-locust-stats",
        action="store_true",
        help="write no Locust-format CSV stats beside the records",
    )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="in-flight cap (default: from the plan, rate x request deadline, at least 1000); "
        "a request due while it is full is recorded not_sent",
    )
    p.add_argument("--max-tokens", type=int, default=32, help="max_tokens per request (default 32)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="per-attempt total timeout (30)")
    p.add_argument("--connect-timeout-s", type=float, default=3.0, help="TCP connect timeout (3)")
    p.add_argument(
        "--ttft-timeout-s", type=float, default=10.0, help="first-token timeout (10; 0: none)"
    )
    p.add_argument(
        "--idle-timeout-s", type=float, default=5.0, help="inter-chunk timeout (5; 0: none)"
    )
    p.add_argument("--api", choices=("chat", "completions"), default="chat")
    p.add_argument("--seed", type=int, default=0, help="schedule/prompt seed (default 0)")
    p.add_argument("--model", default="sim", help="model name in the body (default sim)")
    p.add_argument("--prompt-words", type=int, default=16, help="words per prompt (16)")
    p.add_argument(
        "--prompt-mix",
        default=None,
        metavar="CLASS:W,...",
        help="prompt-length mix, e.g. short:70,mid:25,long:5 (named classes also set max_tokens) "
        "or 64:80,2048:20 (word counts); replaces --prompt-words",
    )
    p.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    p.add_argument("--no-usage", action="store_true", help="do not send stream_options")
    p.add_argument(
        "--header", action="append", default=[], metavar="K:V", help="extra header (repeatable)"
    )
    p.add_argument("--progress-s", type=float, default=5.0, help="seconds between progress lines")
    p.add_argument(
        "--retry-attempts", type=int, default=1, help="total attempts per request (default 1)"
    )
    p.add_argument(
        "--retry-backoff-s", type=float, default=0.2, help="base backoff, doubled per retry (0.2)"
    )
    p.add_argument(
        "--attempt-timeout-s", type=float, default=None, help="per-attempt timeout (--timeout-s)"
    )
    p.add_argument(
        "--retry-on", default=None, metavar="A,B,C", help="error classes to retry (see docs)"
    )
    p.add_argument(
        "--retry-after-max-s",
        type=float,
        default=None,
        help="honour a Retry-After up to this many seconds (default: ignored)",
    )
    p.add_argument(
        "--client",
        choices=("raw", "openai-sdk"),
        default="raw",
        help="who sends: raw (ours, default) or openai-sdk (the openai package's AsyncOpenAI)",
    )
    p.add_argument(
        "--sdk-max-retries", type=int, default=None, help="openai-sdk: max_retries (SDK: 2)"
    )
    p.add_argument(
        "--sdk-timeout-s", type=float, default=None, help="openai-sdk: timeout (SDK: 600 s)"
    )
    p.add_argument(
        "--idempotency-header",
        default=None,
        metavar="NAME",
        help="send the logical request id in this header too, the same on every retry",
    )
    p.add_argument(
        "--profile", default=None, metavar="D:R,...", help='rate phases, e.g. "10:8,15:24,15:8"'
    )
    p.add_argument(
        "--trace", default=None, metavar="FILE", help="replay a Mooncake/AIPerf JSONL trace"
    )
    p.add_argument("--trace-speed", type=float, default=1.0, help="trace time scale (1)")
    return p


def _progress(snap: dict[str, Any]) -> None:
    print(
        f"load t={snap['t']:.0f}s sent={snap['sent']} ok={snap['ok']} failed={snap['failed']} "
        f"in_flight={snap['in_flight']} not_sent={snap['not_sent']} retries={snap['retries']}",
        file=sys.stderr,
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok or stopped by signal, 2 bad arguments)."""
    parent = os.getppid()  # first thing: the watchdog compares against it
    early: list[int] = []  # a signal that arrives before the event loop runs still stops cleanly
    previous = {
        sig: signal.signal(sig, lambda signum, frame: early.append(signum))
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        return _main(argv, early, parent)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _watch_parent(parent: int, stop: asyncio.Event, period_s: float = 0.2) -> None:
    """Set ``stop`` once the parent process is gone (``os.getppid()`` no longer ``parent``)."""
    while not stop.is_set():
        if os.getppid() != parent:
            print(f"{PROG}: parent process {parent} is gone; stopping", file=sys.stderr)
            stop.set()
            return
        await asyncio.sleep(period_s)


def _parsed(
    parser: argparse.ArgumentParser, flag: str, parse: Callable[[str], _T], text: str
) -> _T:
    """``parse(text)``; a ``ValueError`` ends the program with ``parser.error("<flag>: <why>")``."""
    try:
        return parse(text)
    except ValueError as exc:
        parser.error(f"{flag}: {exc}")


def _main(argv: list[str] | None, early: list[int], parent: int) -> int:
    # imported here so that the signal handlers above are in place during the slow aiohttp import
    from .client import DEFAULT_RETRY_ON, INFLIGHT_FILE, LoadSpec, new_loop, run_load
    from .mix import parse_prompt_mix
    from .records import RecordWriter
    from .schedule import parse_profile, truncate_profile

    parser = build_parser()
    args = parser.parse_args(argv)
    profile = None
    if args.profile is not None:
        profile = _parsed(parser, "--profile", parse_profile, args.profile)
        if args.duration_s is not None:
            try:
                profile = truncate_profile(profile, args.duration_s)
            except ValueError:
                parser.error(f"--duration-s must be a finite number > 0, got {args.duration_s!r}")
    elif args.trace is None:  # a trace defines the schedule (trace.py)
        missing = [
            f for f, v in (("--rate", args.rate), ("--duration-s", args.duration_s)) if v is None
        ]
        if missing:
            parser.error(f"{' and '.join(missing)} required (or --profile, or --trace)")
    prompt_mix = None
    if args.prompt_mix is not None:
        prompt_mix = _parsed(parser, "--prompt-mix", parse_prompt_mix, args.prompt_mix)
    for flag, value in (
        ("--ttft-timeout-s", args.ttft_timeout_s),
        ("--idle-timeout-s", args.idle_timeout_s),
    ):
        if not (value >= 0 and math.isfinite(value)):
            parser.error(f"{flag} must be a number of seconds >= 0 (0: no limit), got {value!r}")
    retry_on = DEFAULT_RETRY_ON
    if args.retry_on is not None:
        retry_on = tuple(c.strip() for c in args.retry_on.split(",") if c.strip())
    headers: dict[str, str] = {}
    for h in args.header:
        if ":" not in h:
            parser.error(f"--header must be K:V, got {h!r}")
        k, v = h.split(":", 1)
        headers[k.strip()] = v.strip()
    # API key from the environment only (never in argv, where `ps` shows it); see safety/redact.py
    try:
        api_key = env_key()
    except ValueError as exc:
        parser.error(str(exc))
    if api_key and not any(k.lower() == "authorization" for k in headers):
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        spec = LoadSpec(
            url=args.url,
            api=args.api,
            model=args.model,
            rate_rps=args.rate if args.rate is not None else 1.0,
            duration_s=args.duration_s if args.duration_s is not None else 1.0,
            max_concurrency=args.max_concurrency,
            max_tokens=args.max_tokens,
            prompt_words=args.prompt_words,
            prompt_mix=prompt_mix,
            timeout_s=args.timeout_s,
            connect_timeout_s=args.connect_timeout_s,
            ttft_timeout_s=args.ttft_timeout_s if args.ttft_timeout_s > 0 else None,
            idle_timeout_s=args.idle_timeout_s if args.idle_timeout_s > 0 else None,
            seed=args.seed,
            headers=headers,
            include_usage=not args.no_usage,
            arrival=args.arrival,
            retry_attempts=args.retry_attempts,
            retry_backoff_s=args.retry_backoff_s,
            attempt_timeout_s=args.attempt_timeout_s,
            retry_on=retry_on,
            profile=profile,
            trace=args.trace,
            trace_speed=args.trace_speed,
            idempotency_header=args.idempotency_header,
            retry_after_max_s=args.retry_after_max_s,
            client=args.client,
            sdk_max_retries=args.sdk_max_retries,
            sdk_timeout_s=args.sdk_timeout_s,
        )
    except ValueError as exc:
        parser.error(str(exc))
    try:  # the environment's choices, before any traffic: one line, not a traceback
        chunkpath.path()
    except ValueError as exc:
        parser.error(str(exc))
    if not args.progress_s > 0:
        parser.error("--progress-s must be > 0")
    out = Path(args.out)
    try:
        writer = RecordWriter(out)
    except OSError as exc:
        parser.error(f"cannot write --out {out}: {exc.strerror or exc}")

    async def run() -> dict[str, Any]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if early:
            stop.set()
        watchdog = asyncio.create_task(_watch_parent(parent, stop))
        try:
            return await run_load(
                spec,
                writer,
                stop,
                _progress,
                args.progress_s,
                inflight_path=out.with_name(INFLIGHT_FILE),
            )
        finally:
            watchdog.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    with writer, asyncio.Runner(loop_factory=new_loop) as runner:
        summary = runner.run(run())
    summary["out"] = str(out)
    summary["records"] = writer.count
    if not args.no_locust_stats:
        from .locuststats import write_locust_stats

        try:
            paths = write_locust_stats(out)
            summary["locust_stats"] = {k: str(v) for k, v in paths.items()}
        except (OSError, ValueError) as exc:
            print(f"{PROG}: warning: no Locust CSV stats: {exc}", file=sys.stderr, flush=True)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
