"""This project's Locust user as a peer: every attempt recorded with every chunk time
(``chaoslib_infer.locust.user``), to price the recording against plain Locust
(``counting.py``). ``benchmarks/client_ceiling.py --peers locust-recorded``.
"""

from __future__ import annotations

import os
from typing import ClassVar

from chaoslib_infer.locust.user import LLMStreamUser


class Recorded(LLMStreamUser):
    """Closed loop like ``counting.py``; records go to ``$CHAOS_INFER_RECORDS``."""

    api: ClassVar[str] = "completions"
    model: ClassVar[str] = os.environ.get("CEILING_MODEL", "chaos-sim")
    max_tokens: ClassVar[int] = int(os.environ.get("CEILING_MAX_TOKENS", "32"))
    extra_body: ClassVar[dict[str, object]] = {"ignore_eos": True}
