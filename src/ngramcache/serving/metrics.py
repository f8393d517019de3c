"""The engine's counters in Prometheus' text format."""

from __future__ import annotations

__all__ = ["metrics_text"]


def metrics_text(engine) -> bytes:
    """The engine's counters in Prometheus' text format (prometheus-client)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self):
            c, s = engine.snapshot()
            for key, help_ in (("requests", "requests run (finished, failed or cancelled)"),
                               ("cancelled", "requests cancelled (the client went away)"),
                               ("failed", "requests that failed"),
                               ("prompt_tokens", "prompt tokens"),
                               ("prompt_tokens_cached", "prompt tokens reused from the KV cache"),
                               ("tokens", "tokens generated"),
                               ("drafted", "drafted tokens verified"),
                               ("accepted", "drafted tokens accepted")):
                yield CounterMetricFamily(f"ngramcache_{key}", help_, value=c.get(key, 0))
            for key, help_ in (("queue", "waiting for the model"), ("prompt", "decoding prompts"),
                               ("draft", "drafting"), ("verify", "verifying drafts and choosing tokens"),
                               ("total", "generating, prompts included")):
                yield CounterMetricFamily(f"ngramcache_{key}_seconds", f"seconds spent {help_}",
                                          value=s.get(key, 0.0))
            drafted = c.get("drafted", 0)
            yield GaugeMetricFamily("ngramcache_acceptance", "accepted / drafted so far",
                                    value=c.get("accepted", 0) / drafted if drafted else 0.0)
            yield GaugeMetricFamily("ngramcache_queued_requests", "requests waiting", value=engine.queued)
            yield CounterMetricFamily("ngramcache_memory_save_errors", "memory saves that failed",
                                      value=len(engine.save_errors))
            if engine.memory is not None:
                yield GaugeMetricFamily("ngramcache_memory_bytes", "bytes of cross-request memory",
                                        value=engine.memory.nbytes)
                yield GaugeMetricFamily("ngramcache_memory_tokens", "tokens of cross-request memory",
                                        value=engine.memory.n_tokens)

    registry = CollectorRegistry()
    registry.register(_Collector())
    return generate_latest(registry)
