"""Shared state of one replica: scheduler, KV-cache bytes, faults, metrics, ledger and TTFT log."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from chaoslib_infer.lab import kernel_stamps
from chaoslib_infer.lab.engine.config import EngineConfig
from chaoslib_infer.lab.engine.faults import (
    CRASH_EXIT_CODE,
    FaultBoard,
    FaultSpec,
    parse_fault_header,
    read_persisted,
    write_persisted,
)
from chaoslib_infer.lab.engine.metrics import Metrics
from chaoslib_infer.lab.engine.scheduler import Scheduler

#: Tokens per KV-cache block (memory is allocated block by block, like vLLM's paged attention).
KV_BLOCK_TOKENS = 16


class KvHold:
    """Real, touched bytes standing for one sequence's KV cache, grown block by block."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._block_bytes = engine.config.kv_bytes_per_token * KV_BLOCK_TOKENS
        self._blocks: list[bytes] = []
        self._capacity = 0  # tokens the allocated blocks can hold
        self.tokens = 0

    def grow(self, tokens: int) -> None:
        """Hold ``tokens`` more tokens; allocates (and writes) whole blocks as needed."""
        self.tokens += tokens
        self._engine.kv_tokens += tokens
        if self._block_bytes == 0 or self.tokens <= self._capacity:
            return
        blocks = -(-(self.tokens - self._capacity) // KV_BLOCK_TOKENS)
        self._blocks.append(b"\x01" * (self._block_bytes * blocks))  # bytes * n writes every page
        self._capacity += blocks * KV_BLOCK_TOKENS

    def release(self) -> None:
        """Free every held byte."""
        self._engine.kv_tokens -= self.tokens
        self.tokens = 0
        self._capacity = 0
        self._blocks.clear()


class Engine:
    """Shared state of one replica: config, scheduler, KV accounting, metrics, ledger."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.t_start = time.monotonic()
        self.scheduler = Scheduler(config.max_num_seqs, config.max_waiting)
        self.kv_tokens = 0
        self.generations_started = 0
        self.faults = FaultBoard()
        self.hung: set[asyncio.Future[None]] = set()
        self.metrics = Metrics(config.model)
        m = config.model
        self.metrics.running.labels(m).set_function(lambda: self.scheduler.running)
        self.metrics.waiting.labels(m).set_function(lambda: len(self.scheduler.waiters))
        self.metrics.kv_usage.labels(m).set_function(
            lambda: self.kv_tokens / self.config.kv_cache_tokens
        )
        self._ledger_fd: int | None = None
        if config.ledger is not None:
            config.ledger.parent.mkdir(parents=True, exist_ok=True)
            self._ledger_fd = os.open(config.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._ttft_fd: int | None = None
        if config.ttft_log is not None:
            self._ttft_fd = os.open(config.ttft_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.fault_file: Path | None = None
        if config.fault_state_dir is not None:
            self.fault_file = config.fault_state_dir / f"{config.replica_id}.json"
            restored = read_persisted(self.fault_file)
            for spec in restored:
                self.faults.set(spec)
            if restored:  # ledger ``{"event": "fault_restore", ...}``: re-armed at start
                self.record_admin("restore", restored)

    def persist_faults(self) -> None:
        """Rewrite the fault-state file from the armed faults (``PERSISTENT_MODES`` only); a
        no-op without ``--fault-state-dir``.

        Raises:
            OSError: the file could not be written.
        """
        if self.fault_file is not None:
            write_persisted(self.fault_file, self.faults.active())

    def ready(self) -> bool:
        """True once the simulated weight load is over."""
        return time.monotonic() - self.t_start >= self.config.load_delay_s

    def record_generation(self, request_id: str) -> float:
        """Append the ledger line for a generation that starts now; returns the warm-up penalty (s)."""
        if self._ledger_fd is not None:
            line = json.dumps(
                {
                    "t": time.time(),
                    "event": "generation",
                    "replica": self.config.replica_id,
                    "request_id": request_id,
                    "pid": os.getpid(),
                }
            )
            os.write(self._ledger_fd, (line + "\n").encode())
        i = self.generations_started
        self.generations_started += 1
        n = self.config.warmup_requests
        if self.config.zero_latency or i >= n:
            return 0.0
        return self.config.warmup_penalty_s * (n - i) / n  # linear decay: full, ..., 1/n

    def record_generation_end(
        self, request_id: str, prompt_tokens: int, completion_tokens: int, outcome: str
    ) -> None:
        """Append the ledger line of a generation that ended (ground truth for wasted tokens).

        Line: ``{"t", "event": "generation_end", "replica", "request_id", "pid",
        "prompt_tokens", "completion_tokens", "outcome"}``: the prompt this generation prefilled
        and the tokens it produced (counts), ``outcome`` ``"done"`` (every token produced, or
        the fault's cut), ``"cancelled"`` (the client went away) or ``"error"``. A process
        killed mid-generation writes none (contracts.md §1).
        """
        self._ledger_line(
            {
                "t": time.time(),
                "event": "generation_end",
                "replica": self.config.replica_id,
                "request_id": request_id,
                "pid": os.getpid(),
                "prompt_tokens": int(prompt_tokens),
                "completion_tokens": int(completion_tokens),
                "outcome": outcome,
            }
        )

    def _ledger_line(self, entry: dict[str, Any]) -> None:
        if self._ledger_fd is not None:
            os.write(self._ledger_fd, (json.dumps(entry) + "\n").encode())

    def record_fault(
        self,
        spec: FaultSpec,
        request_id: str,
        answer: dict[str, Any] | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        """Append the ledger line of a request sabotaged by ``spec`` (ground truth).

        Line: ``{"t", "event": "fault", "mode", "replica", "request_id", "pid", "source",
        "params"}``, plus ``"answer"`` (``http_error``: ``{"status", "code", "retryable",
        "retry_after_s", "profile"}``, ``errors.answer``) and ``"prompt_tokens"`` (the request's
        prompt as this engine counted it: the trigger of a ``crash_on_long_prompt``) when given.
        """
        line: dict[str, Any] = {
            "t": time.time(),
            "event": "fault",
            "mode": spec.mode,
            "replica": self.config.replica_id,
            "request_id": request_id,
            "pid": os.getpid(),
            "source": spec.source,
            "params": spec.params,
        }
        if answer is not None:
            line["answer"] = answer
        if prompt_tokens is not None:
            line["prompt_tokens"] = int(prompt_tokens)
        self._ledger_line(line)

    def record_admin(self, action: str, specs: list[FaultSpec]) -> None:
        """Ledger line ``{"t", "event": "fault_set"|"fault_clear"|"fault_restore", "replica",
        "modes", "faults", "pid"}`` (``restore``: re-armed from the fault-state file at start)."""
        self._ledger_line(
            {
                "t": time.time(),
                "event": f"fault_{action}",
                "replica": self.config.replica_id,
                "modes": [f.mode for f in specs],
                "faults": [f.to_json() for f in specs],
                "pid": os.getpid(),
            }
        )

    def choose_fault(self, header: str | None, prompt_tokens: int) -> FaultSpec | None:
        """The fault sabotaging a request: its ``X-Chaos-Fault`` header, else an armed fault.

        Raises:
            RequestError: 400 on a malformed header.
        """
        if header is not None:
            spec = parse_fault_header(header)
            ok = spec.applies(prompt_tokens) and self.faults.roll(spec)
            return spec if ok else None
        return self.faults.pick(prompt_tokens)

    def release_hung(self) -> int:
        """End every request held by a ``hang`` fault (they get a 503); returns how many."""
        n = 0
        for fut in list(self.hung):
            if not fut.done():
                fut.set_result(None)
                n += 1
        return n

    def itl_scale(self, spec: FaultSpec | None) -> float:
        """ITL multiplier: ``1 + factor * requests served since the slowdown was set``."""
        if spec is None or spec.mode != "slowdown":
            return 1.0
        served = max(0, self.generations_started - spec.served_at_set)
        return 1.0 + float(spec.params["factor"]) * served

    def crash(self, spec: FaultSpec, prompt_tokens: int) -> None:
        """Kill this process (``crash_on_long_prompt``): ``os._exit`` or SIGKILL to itself."""
        how = spec.params.get("how", "exit")
        print(
            f"lab-engine fault crash_on_long_prompt: prompt_tokens={prompt_tokens} > "
            f"n={spec.params['n']}; replica={self.config.replica_id} pid={os.getpid()} dies ({how})",
            file=sys.stderr,
            flush=True,
        )
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(CRASH_EXIT_CODE)

    def record_ttft(
        self, request_id: str, ttft_s: float, stamps: kernel_stamps.Stamps | None = None
    ) -> None:
        """With ``--ttft-log``: append ``{"request_id", "ttft_s", "t"}`` for a first token just
        sent (``ttft_s``: seconds from arrival to the first token handed to the transport, the
        value the TTFT histogram observes; ``t``: unix seconds, now), plus, with ``stamps``
        (``lab.kernel_stamps``), ``rx_at`` (the request's last byte arrived on the socket),
        ``tx_at`` (the first token's bytes left it), unix seconds, ``ttft_kernel_s`` =
        ``tx_at - rx_at`` and their sources ``rx_source``, ``tx_source``."""
        if self._ttft_fd is not None:
            row: dict[str, Any] = {"request_id": request_id, "ttft_s": ttft_s, "t": time.time()}
            if stamps is not None and stamps.rx_at is not None and stamps.tx_at is not None:
                row.update(
                    rx_at=stamps.rx_at,
                    tx_at=stamps.tx_at,
                    ttft_kernel_s=stamps.tx_at - stamps.rx_at,
                    rx_source=stamps.rx_source,
                    tx_source=stamps.tx_source,
                )
            os.write(self._ttft_fd, (json.dumps(row) + "\n").encode())

    def close(self) -> None:
        """Close the ledger (and TTFT log) files."""
        if self._ledger_fd is not None:
            os.close(self._ledger_fd)
            self._ledger_fd = None
        if self._ttft_fd is not None:
            os.close(self._ttft_fd)
            self._ttft_fd = None
