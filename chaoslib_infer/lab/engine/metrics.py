"""The engine's Prometheus metrics: vLLM metric names in a private registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """vLLM-named Prometheus metrics in a private registry."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.",
            labels, registry=r,
        )  # fmt: skip
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            labels, registry=r,
        )  # fmt: skip
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            labels, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            labels, registry=r,
            buckets=[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            labels, registry=r,
            buckets=[0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                     0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            labels, registry=r,
            buckets=[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                     60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
        )  # fmt: skip
        # prometheus_client appends "_total" to counter names on exposition.
        self.success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            ["model_name", "finished_reason"], registry=r,
        )  # fmt: skip
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
            labels, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=r
        )
        self.model = model
        self.preemptions.labels(model).inc(0)
        self.prompt_tokens.labels(model).inc(0)
        self.generation_tokens.labels(model).inc(0)
        for reason in ("stop", "length", "abort"):
            self.success.labels(model, reason).inc(0)
