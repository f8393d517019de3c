"""Speculative decoding on any model: the loop, independent of the library that runs it.

A :class:`Backend` is what the loop needs from a model (tokenize, decode a batch with
logits where asked, drop positions from the KV cache, ...); ``ngramcache.integrations.llama.LlamaBackend``
is one on llama-cpp-python, and tests use a fake one. :func:`generate` runs one request:
one decode per step of [last token + draft], logits only where a token is decided (never
for the prompt), rejected positions removed from the KV cache, and greedy or sampled
verification that yields exactly what the model alone would (same argmax, or same
distribution: a drafted token is kept only when the model's own choice equals it).
:class:`Stream` hands out the text as it is settled.

This module does not need llama-cpp-python.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import numpy as np

from ngramcache._validate import as_tokens, check_int
from ngramcache._prefix import accepted_prefix
from ngramcache.decoding.sampling import Sampler, make_sampler
from ngramcache.decoding.text_sink import TextSink
from ngramcache.drafters.base import Drafter

__all__ = ["Backend", "GenerationResult", "PromptCache", "Sampler", "Stream", "generate"]


class Backend(Protocol):
    """What the speculative loop needs from a model.

    ``decode(tokens, pos0, logits_from)`` appends ``tokens`` at positions
    ``pos0, pos0+1, ...`` (``pos0`` is always the current length) and keeps logits
    for batch indices ``>= logits_from``; ``logits(i)`` is the row of batch index i
    of the last decode (the distribution of the token after it); ``truncate(pos)``
    forgets positions ``>= pos``; ``clear()`` forgets everything. ``tokenize(prompt)``
    turns text or token ids into int32 ids, ``piece(tok)`` is a token's bytes and
    ``is_eog(tok)`` tells an end-of-generation token.

    Optional: ``set_threads(n_threads, n_threads_batch)``, used when ``generate`` is
    given thread counts.
    """

    n_vocab: int
    n_ctx: int
    n_batch: int

    def tokenize(self, prompt) -> np.ndarray: ...
    def clear(self) -> None: ...
    def decode(self, tokens, pos0: int, logits_from: int) -> None: ...
    def logits(self, i: int) -> np.ndarray: ...
    def truncate(self, pos: int) -> None: ...
    def is_eog(self, tok: int) -> bool: ...
    def piece(self, tok: int) -> bytes: ...


_BACKEND_METHODS = ("tokenize", "clear", "decode", "logits", "truncate", "is_eog", "piece")


def is_backend(obj) -> bool:
    """Whether ``obj`` has every method of :class:`Backend`."""
    return all(callable(getattr(obj, attr, None)) for attr in _BACKEND_METHODS)


def _check_backend(backend) -> None:
    if not is_backend(backend):
        missing = [a for a in _BACKEND_METHODS if not callable(getattr(backend, a, None))]
        raise TypeError(f"backend must implement the Backend protocol, got {type(backend).__name__} "
                        f"(missing: {', '.join(missing)})")


@dataclass
class GenerationResult:
    """One request: the generated ``text`` and ``tokens`` (int32), the prompt's length
    ``n_prompt``, the tokens ``drafted`` and of those ``accepted``, the drafted tokens
    accepted at each verify step (``accept_lengths``) and why it stopped
    (``stop_reason``: "length", "eos", "context", or "stop" when ``on_tokens`` asked to
    stop), and how many prompt tokens were already in the KV cache (``n_cached``, with a
    ``PromptCache``).

    Clocks in seconds: ``t_prompt`` (prompt decode), ``t_draft`` (proposing and cache
    updates), ``t_verify`` (batched decodes and token choice after the prompt),
    ``t_total`` (everything, tokenization excluded)."""

    text: str
    tokens: np.ndarray               # generated tokens (int32)
    n_prompt: int
    t_prompt: float
    t_draft: float
    t_verify: float
    t_total: float
    drafted: int
    accepted: int
    accept_lengths: list[int] = field(default_factory=list)  # drafted tokens accepted, per verify step
    stop_reason: str = "length"      # "length", "eos", "context" or "stop"
    n_cached: int = 0                # prompt tokens found in the KV cache (not decoded again)

    @classmethod
    def decoded(cls, backend, tokens: np.ndarray, **fields) -> "GenerationResult":
        """A result whose ``text`` is ``tokens`` decoded with the backend's pieces, as a
        :class:`~ngramcache.decoding.text_sink.TextSink` gives it (invalid UTF-8 becomes
        U+FFFD; an end-of-generation token adds no text)."""
        return cls(text=TextSink.text_of(backend, tokens), tokens=tokens, **fields)

    @property
    def n_tokens(self) -> int:
        """Tokens generated."""
        return int(self.tokens.size)

    @property
    def steps(self) -> int:
        """Decodes after the prompt's (one per verify step)."""
        return len(self.accept_lengths)

    @property
    def acceptance(self) -> float:
        """Accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def gen_tokens_per_s(self) -> float:
        """Tokens per second after the prompt."""
        t = self.t_total - self.t_prompt
        return self.n_tokens / t if t > 0 else float("inf")

    @property
    def e2e_tokens_per_s(self) -> float:
        """Tokens per second, the prompt included."""
        return self.n_tokens / self.t_total if self.t_total > 0 else float("inf")


class PromptCache:
    """What a backend's KV cache holds after a request, so that the next request that
    starts with the same tokens (the next turn of a chat, the same system prompt) decodes
    only the tokens after the shared prefix.

    Pass the same ``PromptCache`` to every ``generate`` call on one backend. It is only
    trusted for that backend and only after a request that ended cleanly (finished,
    stopped, or abandoned between steps); after an error it is emptied, and the next
    request decodes its whole prompt."""

    def __init__(self) -> None:
        self.tokens = np.zeros(0, dtype=np.int32)
        self._backend = None

    def __len__(self) -> int:
        return int(self.tokens.size)

    def clear(self) -> None:
        """Forget what the KV cache holds (the next request decodes its whole prompt)."""
        self.tokens = np.zeros(0, dtype=np.int32)
        self._backend = None

    def reusable(self, backend, prompt_tokens: np.ndarray) -> int:
        """How many leading tokens of ``prompt_tokens`` are in ``backend``'s KV cache and
        can be kept (at most all but the last: its logits are needed)."""
        if self._backend is not backend or not self.tokens.size:
            return 0
        return accepted_prefix(self.tokens, prompt_tokens[:-1])

    def _set(self, backend, tokens: np.ndarray) -> None:
        self._backend = backend
        self.tokens = tokens

    def __repr__(self) -> str:
        return f"<PromptCache {self.tokens.size} tokens>"


class Stream:
    """Iterate over generated text pieces; ``.result`` holds the ``GenerationResult``
    once the iteration is over. Same arguments as :func:`generate`. The pieces joined
    are ``result.text``."""

    def __init__(self, backend: Backend, prompt, drafter: Drafter | None = None, max_tokens: int = 128, **kw):
        self.result: GenerationResult | None = None
        self._args = (backend, prompt, drafter, max_tokens, kw)

    def __iter__(self) -> Iterator[str]:
        backend, prompt, drafter, max_tokens, kw = self._args
        kw = dict(kw)
        _check_backend(backend)
        pieces: list[str] = []
        sink = TextSink(backend)
        user_cb = kw.pop("on_tokens", None)

        def on_tokens(tokens, n_from_draft):
            stop = user_cb(tokens, n_from_draft) if user_cb is not None else None
            text = sink.feed(tokens)
            if text:
                pieces.append(text)
            return stop

        gen = _run(backend, prompt, drafter, max_tokens, on_tokens=on_tokens, **kw)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                self.result = stop.value
                break
            yield from pieces
            pieces.clear()
        yield from pieces
        tail = sink.flush()
        if tail:
            yield tail


def generate(backend: Backend, prompt, drafter: Drafter | None = None, max_tokens: int = 128, *,
             temperature: float = 0.0, seed: int | None = None, top_k: int = 0, top_p: float = 1.0,
             n_threads: int | None = None, n_threads_batch: int | None = None, stop_at_eos: bool = True,
             on_tokens: Callable[[list[int], int], bool | None] | None = None,
             on_logits: Callable[[int, np.ndarray], None] | None = None,
             prompt_cache: PromptCache | None = None,
             should_stop: Callable[[], bool] | None = None) -> GenerationResult:
    """Generate up to ``max_tokens`` tokens after ``prompt`` (text, or token ids).

    ``drafter`` None is plain decoding (one token per decode). Greedy
    (``temperature=0``): every token is the argmax of the logits the model computed at
    its position. ``temperature > 0``: each position is sampled from the model's
    distribution (optionally ``top_k`` / ``top_p``) and a drafted token is kept only
    when the sample equals it, so the text has exactly the model's distribution, and
    with a ``seed`` it is the same text with or without drafting (each position's draw
    depends only on the seed and the position: ``ngramcache.decoding.sampling``).

    ``n_threads`` / ``n_threads_batch`` go to the backend's ``set_threads`` (None:
    leave them as they are). ``on_tokens(tokens, n_from_draft)`` is called as tokens
    are settled (streaming; the first ``n_from_draft`` came from the drafter); when it
    returns True generation ends there (``stop_reason`` "stop": a stop string was seen,
    the client went away). ``prompt_cache``: a :class:`PromptCache` shared by the
    requests on this backend, so that a prompt sharing a prefix with what the KV cache
    holds decodes only the rest (``n_cached`` in the result).
    ``on_logits(i, row)`` sees the logits row that decided generated token i (for
    checks; the row is only valid during the call). ``should_stop()`` is asked between
    the prompt's ``n_batch`` pieces: True ends generation there, before any token
    (``stop_reason`` "stop"), so that a long prompt pass can be stopped (a server
    shutting down, a client gone) before it ends.
    """
    gen = _run(backend, prompt, drafter, max_tokens, temperature=temperature, seed=seed, top_k=top_k,
               top_p=top_p, n_threads=n_threads, n_threads_batch=n_threads_batch,
               stop_at_eos=stop_at_eos, on_tokens=on_tokens, on_logits=on_logits, prompt_cache=prompt_cache,
               should_stop=should_stop)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


_NO_DRAFT = np.zeros(0, dtype=np.int32)


def _set_threads(m, n_threads, n_threads_batch) -> None:
    n_threads = check_int("n_threads", n_threads, 1, none_ok=True)
    n_threads_batch = check_int("n_threads_batch", n_threads_batch, 1, none_ok=True)
    if n_threads is None and n_threads_batch is None:
        return
    set_threads = getattr(m, "set_threads", None)
    if not callable(set_threads):
        raise TypeError(f"n_threads: this backend ({type(m).__name__}) has no set_threads")
    set_threads(n_threads, n_threads_batch)


def _run(m: Backend, prompt, drafter, max_tokens, *, temperature=0.0, seed=None, top_k=0, top_p=1.0,
         n_threads=None, n_threads_batch=None, stop_at_eos=True, on_tokens=None, on_logits=None,
         prompt_cache=None, should_stop=None):
    # A generator so that ``stream`` can hand out text between steps; returns the result.
    max_tokens = check_int("max_tokens", max_tokens, 0)
    if drafter is not None and not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must implement the Drafter protocol, got {type(drafter).__name__}")
    _check_backend(m)
    if prompt_cache is not None and not isinstance(prompt_cache, PromptCache):
        raise TypeError(f"prompt_cache must be a PromptCache, got {type(prompt_cache).__name__}")
    sampler = make_sampler(temperature, top_k, top_p, seed)
    prompt_tokens = m.tokenize(prompt)
    if prompt_tokens.size == 0:
        raise ValueError("prompt is empty")
    if prompt_tokens.size >= m.n_ctx:
        raise ValueError(f"prompt too long ({prompt_tokens.size} tokens, the context holds {m.n_ctx})")
    _set_threads(m, n_threads, n_threads_batch)
    out = np.empty(max_tokens, dtype=np.int32)
    t_draft = t_verify = 0.0
    drafted = accepted = 0
    accept_lengths: list[int] = []
    stop_reason = "length"
    n_p = int(prompt_tokens.size)
    t0 = time.perf_counter()
    n_keep = prompt_cache.reusable(m, prompt_tokens) if prompt_cache is not None else 0
    if n_keep and not _can_keep(m, n_keep):
        n_keep = 0
    if prompt_cache is not None:
        prompt_cache.clear()  # trusted again only once the KV cache is consistent
    if n_keep:
        m.truncate(n_keep)
    else:
        m.clear()
    # the prompt after the kept prefix, in n_batch pieces, with logits for its last token only
    for s in range(n_keep, n_p, m.n_batch):
        if s > n_keep and should_stop is not None and should_stop():
            # the KV cache holds part of the prompt: the prompt cache stays cleared
            t = time.perf_counter() - t0
            return GenerationResult.decoded(m, out[:0], n_prompt=n_p, t_prompt=t, t_draft=0.0, t_verify=0.0,
                                            t_total=t, drafted=0, accepted=0, accept_lengths=[],
                                            stop_reason="stop", n_cached=n_keep)
        chunk = prompt_tokens[s : s + m.n_batch]
        m.decode(chunk, s, len(chunk) - 1 if s + len(chunk) == n_p else len(chunk))
    n_past = n_p  # positions in the KV cache; the newest token is not among them yet
    if max_tokens == 0:
        t = time.perf_counter() - t0
        if prompt_cache is not None:
            prompt_cache._set(m, prompt_tokens.copy())
        return GenerationResult.decoded(m, out[:0], n_prompt=n_p, t_prompt=t, t_draft=0.0, t_verify=0.0,
                                        t_total=t, drafted=0, accepted=0, accept_lengths=[],
                                        stop_reason="length", n_cached=n_keep)
    row = m.logits(len(chunk) - 1)
    if on_logits is not None:
        on_logits(0, row)
    tok = sampler(row, n_p)
    t_prompt = time.perf_counter() - t0
    out[0] = tok
    n_out = 1
    consistent = True  # the KV cache holds exactly prompt + out[:n_out - 1]
    # a drafter that can check its costs against the verifications' real times is told them
    verified = getattr(drafter, "verified", None) if drafter is not None else None
    try:
        if drafter is not None:
            td = time.perf_counter()
            drafter.reset(prompt_tokens)
            drafter.accept(out[:1])
            t_draft += time.perf_counter() - td
        if on_tokens is not None and on_tokens([tok], 0):
            stop_reason = "stop"
        yield
        if stop_reason == "length" and stop_at_eos and m.is_eog(tok):
            stop_reason = "eos"
        room_batch = max(m.n_batch, 2) - 1
        while stop_reason == "length" and n_out < max_tokens:
            if n_past >= m.n_ctx:
                stop_reason = "context"
                break
            draft = _NO_DRAFT
            if drafter is not None:
                room = min(max_tokens - n_out - 1, m.n_ctx - n_past - 1, room_batch)
                if room > 0:
                    td = time.perf_counter()
                    draft = as_tokens(drafter.propose(room), "draft")[:room]
                    t_draft += time.perf_counter() - td
            k = int(draft.size)
            tv = time.perf_counter()
            consistent = False
            m.decode(np.concatenate(([tok], draft)) if k else (tok,), n_past, 0)
            # keep drafted tokens while the model's own choice equals them
            new: list[int] = []
            for i in range(k + 1):
                row = m.logits(i)
                if on_logits is not None:
                    on_logits(n_out + i, row)
                choice = sampler(row, n_p + n_out + i)
                new.append(choice)
                if i == k or choice != int(draft[i]):
                    break
            n_acc = len(new) - 1
            if n_acc < k:
                m.truncate(n_past + 1 + n_acc)
            tv = time.perf_counter() - tv
            t_verify += tv
            if verified is not None:
                verified(k + 1, tv)
            if k:
                drafted += k
                accepted += n_acc
            accept_lengths.append(n_acc)
            n_past += 1 + n_acc
            # an end-of-generation token ends the text, even inside an accepted draft
            if stop_at_eos:
                for j, t in enumerate(new):
                    if m.is_eog(t):
                        new = new[: j + 1]
                        stop_reason = "eos"
                        break
            new = new[: max_tokens - n_out]
            out[n_out : n_out + len(new)] = new
            n_out += len(new)
            # tokens decoded past the end of the text (a cut accepted draft) are dropped
            if n_past > n_p + n_out - 1:
                m.truncate(n_p + n_out - 1)
                n_past = n_p + n_out - 1
            consistent = True
            tok = new[-1]
            if drafter is not None:
                td = time.perf_counter()
                drafter.accept(out[n_out - len(new) : n_out])
                t_draft += time.perf_counter() - td
            if on_tokens is not None and on_tokens(new, min(n_acc, len(new))) and stop_reason == "length":
                stop_reason = "stop"
            yield
    finally:
        if prompt_cache is not None and consistent:
            prompt_cache._set(m, np.concatenate([prompt_tokens, out[: n_out - 1]]))
    t_total = time.perf_counter() - t0
    return GenerationResult.decoded(m, out[:n_out].copy(), n_prompt=n_p, t_prompt=t_prompt, t_draft=t_draft,
                                    t_verify=t_verify, t_total=t_total, drafted=drafted, accepted=accepted,
                                    accept_lengths=accept_lengths, stop_reason=stop_reason, n_cached=n_keep)


def _can_keep(m, n_keep: int) -> bool:
    # a backend whose cache cannot always keep a prefix (a sliding-window cache that
    # already dropped what the next token would attend to) says so
    can_keep = getattr(m, "can_keep", None)
    return bool(can_keep(n_keep)) if callable(can_keep) else True
