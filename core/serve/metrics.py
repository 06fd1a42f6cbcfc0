"""The Prometheus metrics of ``hwplug serve`` (``GET /metrics``), in a registry of their own.

Counted by the server: requests by endpoint and status code, prompt and generated tokens,
time to first token and the time between tokens (histograms, seconds), and requests in
flight and queued (admitted beyond what the engine runs at once). Read from the engine
at each scrape (:meth:`~hwplug.model_zoo.engine.llm_engine.LLMEngine.stats`): sequences
running and waiting, KV blocks in use and in all, the prefix cache's hit rate
(prompt tokens found cached over prompt tokens looked up), and the decode step graphs:
batch buckets recorded (all of them after ``hwplug serve``'s warm-up), steps replayed and
decode steps run eagerly. Names start with ``hwplug_``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from hwplug.model_zoo.engine.llm_engine import EngineStats

#: Histogram buckets (seconds) of the time to the first token and between tokens.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class _EngineCollector(Collector):
    """Gauges read at scrape time from the engine and the server's admission count."""

    def __init__(self, stats: Callable[[], EngineStats],
                 admitted: Callable[[], tuple[int, int]]) -> None:
        self._stats, self._admitted = stats, admitted

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        in_flight, queued = self._admitted()
        for name, help_text, value in (
                ("hwplug_requests_in_flight", "requests admitted and not yet answered",
                 in_flight),
                ("hwplug_queue_length", "requests admitted beyond what the engine runs at "
                                        "once (max_num_seqs)", queued),
                ("hwplug_num_requests_running", "sequences the engine is running",
                 stats.num_running),
                ("hwplug_num_requests_waiting", "sequences waiting for the engine",
                 stats.num_waiting),
                ("hwplug_kv_blocks_used", "KV-cache blocks in use", stats.kv_blocks_used),
                ("hwplug_kv_blocks_total", "KV-cache blocks in all", stats.kv_blocks_total),
                ("hwplug_prefix_cache_hit_rate", "prompt tokens found in the prefix cache "
                 "over prompt tokens looked up (0 before any)",
                 stats.prefix_hit_tokens / stats.prefix_queried_tokens
                 if stats.prefix_queried_tokens else 0.0),
                ("hwplug_step_graph_buckets", "decode batch sizes recorded as step graphs",
                 stats.step_graph_buckets)):
            yield GaugeMetricFamily(name, help_text, value=value)
        for name, help_text, value in (
                ("hwplug_prefix_cache_queried_tokens", "prompt tokens looked up in the "
                 "prefix cache", stats.prefix_queried_tokens),
                ("hwplug_prefix_cache_hit_tokens", "prompt tokens found in the prefix cache",
                 stats.prefix_hit_tokens),
                ("hwplug_preemptions", "sequences preempted for lack of KV blocks",
                 stats.num_preemptions),
                ("hwplug_engine_steps", "engine steps run", stats.num_steps),
                ("hwplug_replayed_steps", "decode and verify steps served by a step graph's "
                 "replay", stats.replayed_steps),
                ("hwplug_eager_decode_steps", "decode and verify steps run eagerly (no step "
                 "graph: a bucket not recorded yet or refused, or too large)",
                 stats.eager_decode_steps),
                ("hwplug_spec_proposed_tokens", "speculative decoding: tokens proposed and "
                 "verified", stats.spec_proposed_tokens),
                ("hwplug_spec_accepted_tokens", "speculative decoding: proposed tokens "
                 "accepted", stats.spec_accepted_tokens),
                ("hwplug_spec_verifications", "speculative decoding: verify steps, one per "
                 "sequence", stats.spec_verifications)):
            yield CounterMetricFamily(name, help_text, value=value)


class Metrics:
    """The server's metrics; ``stats`` reads the engine, ``admitted`` returns (requests
    in flight, requests queued)."""

    def __init__(self, stats: Callable[[], EngineStats],
                 admitted: Callable[[], tuple[int, int]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("hwplug_requests", "requests answered, by endpoint and "
                                "status code", ("endpoint", "status"), registry=self.registry)
        self.prompt_tokens = Counter("hwplug_prompt_tokens", "prompt tokens of generation "
                                     "requests", registry=self.registry)
        self.generation_tokens = Counter("hwplug_generation_tokens", "tokens generated",
                                         registry=self.registry)
        self.time_to_first_token = Histogram(
            "hwplug_time_to_first_token_seconds", "from a request's arrival to its first "
            "token", buckets=TTFT_BUCKETS, registry=self.registry)
        self.inter_token_latency = Histogram(
            "hwplug_inter_token_latency_seconds", "between two tokens of one prompt's "
            "request", buckets=ITL_BUCKETS, registry=self.registry)
        self.registry.register(_EngineCollector(stats, admitted))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
