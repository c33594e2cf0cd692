"""Prometheus view of a local engine: read from its latest stats snapshot at scrape time.

A custom collector (no gauges set from the engine thread): each scrape calls the provider's
`engine_stats()` once and reports queue, running, batch size, KV blocks, prefix-cache hits and
MTP speculation (drafts proposed, verified, accepted, acceptance, draft time), labelled with
the provider's name. A worker without the engine reports the snapshot it last polled from
worker 0 (providers/local/worker_engine.py), and nothing before the first one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backend.engine.interface import EngineStats


class EngineCollector(Collector):
    def __init__(self, provider: str, read_stats: Callable[[], EngineStats | None]) -> None:
        self._provider = provider
        self._read_stats = read_stats

    def collect(self) -> Iterator[Metric]:
        stats = self._read_stats()
        if stats is None:
            return
        gauges = {
            "engine_waiting_requests": ("Requests queued, not yet running", stats.num_waiting),
            "engine_running_requests": ("Requests running", stats.num_running),
            "engine_batch_tokens": ("New tokens in the latest step", stats.last_batch_tokens),
            "engine_batch_sequences": ("Sequences in the latest step", stats.last_batch_seqs),
            "engine_kv_blocks_used": (
                "KV cache blocks in use",
                stats.num_total_blocks - stats.num_free_blocks,
            ),
            "engine_kv_blocks_total": ("KV cache blocks in the pool", stats.num_total_blocks),
            "engine_prefix_cache_hit_rate": (
                "Prompt tokens served from the prefix cache / prompt tokens looked up",
                stats.prefix_cache_hit_tokens_total / stats.prefix_cache_query_tokens_total
                if stats.prefix_cache_query_tokens_total
                else 0.0,
            ),
            "engine_spec_num_tokens": (
                "MTP draft tokens per speculative step (0: speculation off)",
                stats.spec_num_tokens,
            ),
            "engine_spec_acceptance_rate": (
                "MTP drafts accepted / drafts verified",
                stats.spec_acceptance_rate,
            ),
            "engine_spec_mean_accepted_length": (
                "Tokens emitted per verification (accepted drafts + 1)",
                stats.spec_mean_accepted_length,
            ),
        }
        for name, (doc, value) in gauges.items():
            gauge = GaugeMetricFamily(name, doc, labels=["provider"])
            gauge.add_metric([self._provider], value)
            yield gauge
        counters = {
            "engine_steps": ("Engine steps run", stats.num_steps_total),
            "engine_preemptions": ("Sequences preempted", stats.num_preemptions_total),
            "engine_generated_tokens": ("Tokens generated", stats.num_generated_tokens_total),
            "engine_prefix_cache_hit_tokens": (
                "Prompt tokens served from the prefix cache",
                stats.prefix_cache_hit_tokens_total,
            ),
            "engine_spec_draft_steps": (
                "Steps that ran the MTP drafter",
                stats.spec_draft_steps_total,
            ),
            "engine_spec_proposed_tokens": (
                "Draft tokens proposed by the MTP layer",
                stats.spec_proposed_tokens_total,
            ),
            "engine_spec_verified_tokens": (
                "Draft tokens verified by the target model",
                stats.spec_verified_tokens_total,
            ),
            "engine_spec_accepted_tokens": (
                "Draft tokens accepted",
                stats.spec_accepted_tokens_total,
            ),
            "engine_spec_verifications": (
                "Sequence steps that verified drafts",
                stats.spec_verifications_total,
            ),
            "engine_spec_draft_seconds": (
                "Seconds spent drafting with the MTP layer",
                stats.spec_draft_seconds_total,
            ),
        }
        for name, (doc, value) in counters.items():
            counter = CounterMetricFamily(name, doc, labels=["provider"])
            counter.add_metric([self._provider], value)
            yield counter


def register_engine_metrics(
    registry: CollectorRegistry, provider: str, read_stats: Callable[[], EngineStats | None]
) -> Callable[[], None]:
    """Add the collector to `registry`; returns the function that removes it again."""
    collector = EngineCollector(provider, read_stats)
    registry.register(collector)
    return lambda: registry.unregister(collector)
