"""The engine's counters and clocks (:class:`Tally`), and their Prometheus text."""

from __future__ import annotations

import collections
import threading

__all__ = ["metrics_text", "Tally"]


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


class Tally:
    """The engine's counters (requests, tokens, drafts) and clocks (seconds), updated by
    its worker and read by ``/metrics``: thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counters: collections.Counter = collections.Counter()
        self.seconds: collections.Counter = collections.Counter()

    def count(self, result=None, cancelled: int = 0, failed: int = 0) -> None:
        """One request ended: with its ``JobResult``, or cancelled, or failed."""
        with self._lock:
            c = self.counters
            c["requests"] += 1
            c["cancelled"] += cancelled
            c["failed"] += failed
            if result is not None:
                c["cancelled"] += result.finish_reason == "cancelled"
                c["prompt_tokens"] += result.n_prompt
                c["prompt_tokens_cached"] += result.n_cached
                c["tokens"] += result.n_tokens
                c["drafted"] += result.drafted
                c["accepted"] += result.accepted
                s = self.seconds
                s["queue"] += result.t_queue
                s["prompt"] += result.t_prompt
                s["draft"] += result.t_draft
                s["verify"] += result.t_verify
                s["total"] += result.t_total

    def snapshot(self) -> tuple[dict, dict]:
        """(counters, seconds) so far, copied."""
        with self._lock:
            return dict(self.counters), dict(self.seconds)
