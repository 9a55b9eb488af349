"""Configuration of one simulated engine replica (:class:`EngineConfig`, mirrors the CLI flags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class EngineConfig:
    """Configuration of one simulated engine replica (mirrors the CLI flags).

    Times are seconds, sizes bytes / tokens.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    replica_id: str = "r0"
    ledger: Path | None = None
    model: str = "chaos-sim"
    load_delay_s: float = 1.0
    warmup_requests: int = 3
    warmup_penalty_s: float = 0.5
    prefill_s_per_token: float = 0.0002
    itl_s: float = 0.02
    max_num_seqs: int = 16
    max_waiting: int = 64
    queue_full_status: int = 429
    kv_bytes_per_token: int = 16384
    kv_cache_tokens: int = 65536
    zero_latency: bool = False
    output_tokens: int = 32
    graceful_shutdown_s: float = 5.0
    admin_faults: bool = True
    #: lab admin token: when set, ``/admin/faults`` and the ``X-Chaos-Fault`` header need it (header
    #: ``X-Chaos-Admin-Token``) from every peer, loopback included; None: loopback peers only
    admin_token: str | None = field(default=None, repr=False)
    #: provider profile mimicked (``chaoslib_infer.lab.mimic``); None: the plain engine
    profile: str | None = None
    ttft_log: Path | None = None
    #: folder of the replicas' fault-state files (``<replica_id>.json``): faults of
    #: ``PERSISTENT_MODES`` armed here are re-armed when the replica restarts; None: not kept
    fault_state_dir: Path | None = None

    def __post_init__(self) -> None:
        """Validate values.

        Raises:
            ValueError: on a value the engine cannot run with.
        """
        if self.queue_full_status not in (429, 503):
            raise ValueError("queue_full_status must be 429 or 503")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_waiting < 0 or self.warmup_requests < 0 or self.output_tokens < 1:
            raise ValueError("max_waiting/warmup_requests must be >= 0, output_tokens >= 1")
        if self.kv_bytes_per_token < 0 or self.kv_cache_tokens < 1:
            raise ValueError("kv_bytes_per_token must be >= 0 and kv_cache_tokens >= 1")
        if min(self.load_delay_s, self.warmup_penalty_s, self.prefill_s_per_token, self.itl_s) < 0:
            raise ValueError("delays must be >= 0")
        from chaoslib_infer.providers import PROFILES

        if self.profile is not None and self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}")
