"""A request for the engine (:class:`Job`) and what it produced (:class:`JobResult`)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["Job", "JobResult"]


@dataclass
class JobResult:
    """What a job produced: the text, the tokens, why it stopped (``finish_reason``:
    "stop" for end of text or a stop string, "length", or "cancelled") and the
    speculative figures."""

    text: str
    tokens: np.ndarray
    n_prompt: int
    n_cached: int
    finish_reason: str
    drafter: str | None
    drafted: int
    accepted: int
    t_prompt: float
    t_draft: float
    t_verify: float
    t_total: float
    t_queue: float
    #: one sentence when a drafter drafted nothing, saying why (None otherwise)
    why_no_drafts: str | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def figures(self) -> dict:
        """The figures as JSON-ready numbers."""
        gen = self.t_total - self.t_prompt
        return {
            "drafter": self.drafter, "drafted": self.drafted, "accepted": self.accepted,
            # null, not 0.0, when nothing was drafted: a rate of nothing is no rate
            "acceptance": round(self.acceptance, 4) if self.drafted else None,
            "prompt_tokens_cached": self.n_cached,
            "t_queue": round(self.t_queue, 6), "t_prompt": round(self.t_prompt, 6),
            "t_draft": round(self.t_draft, 6), "t_verify": round(self.t_verify, 6),
            "t_total": round(self.t_total, 6),
            "tokens_per_s": round(self.n_tokens / gen, 3) if gen > 0 and self.n_tokens > 1 else None,
            "why_no_drafts": self.why_no_drafts,
        }


@dataclass
class Job:
    """One request for the engine.

    ``prompt``: token ids. ``on_text(text, from_draft)`` receives the text as it is
    settled, in pieces, each marked whether its tokens came from accepted drafts
    (called on the worker thread). ``speculative``: None for the engine's defaults, else
    ``{"enabled": bool, "drafter": name, "n_draft": int, "options": {...}}`` (any subset),
    checked when the job is submitted. ``cache_prompt``: reuse the KV cache for the shared prefix (see
    docs/serve.md on numerics). Wait for ``done`` (or be called back by ``on_done``, on
    the worker thread); then read ``result`` or ``error``."""

    prompt: np.ndarray
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    speculative: dict | None = None
    cache_prompt: bool = True
    learn: bool = True
    on_text: Callable[[str, bool], None] | None = None
    on_done: Callable[[], None] | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    result: JobResult | None = None
    error: BaseException | None = None
    submitted: float = field(default_factory=time.perf_counter)
    #: why the job was stopped, when it ends with an error rather than a result
    cancel_error: BaseException | None = None
    #: ``speculative`` as checked at submission (``ngramcache.serving.drafting.DraftPlan``)
    plan: tuple | None = None

    def cancel(self, error: BaseException | None = None) -> None:
        """Stop at the next step (or never start). With ``error`` the job ends with it
        (e.g. the server is shutting down) instead of a "cancelled" result."""
        if error is not None and self.cancel_error is None:
            self.cancel_error = error
        self.cancelled.set()
