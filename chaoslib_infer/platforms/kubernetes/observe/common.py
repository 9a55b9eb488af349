"""What the observation's modules share: file name, limits, timestamps, API clients (a leaf)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

#: File name of the sampler's output, in the run directory.
OBSERVATIONS_FILE = "k8s-observations.jsonl"
#: The sampler stops by itself after this many seconds (1 h).
DEFAULT_MAX_DURATION_S = 3600.0
#: (connect, read) timeout of each observation request, seconds.
SAMPLE_TIMEOUT_S = (3.0, 10.0)


def k8s_time(value: Any) -> float | None:
    """A Kubernetes timestamp (RFC 3339, second or microsecond resolution) as unix seconds."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Apis:
    """The three API groups an observation reads (core/v1, discovery.k8s.io/v1, autoscaling/v2)
    over one ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.discovery = client.DiscoveryV1Api(api_client)
        self.autoscaling = client.AutoscalingV2Api(api_client)
