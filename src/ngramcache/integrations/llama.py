"""A real model verifying drafts: llama-cpp-python (``pip install ngramcache[llama]``).

Two ways in:

* ``LlamaDrafter(drafter)``: a ``llama_cpp.llama_speculative.LlamaDraftModel``, so
  ``Llama(model_path, draft_model=LlamaDrafter(...))`` works unchanged with
  ``create_completion``, ``create_chat_completion`` and llama-cpp-python's server. Build
  that ``Llama`` with ``make_llama`` (see "known bug" there).
* ``generate(llm, prompt, drafter, ...)``: ngramcache's own speculative loop
  (``ngramcache.decoding.loop``) on llama.cpp's low-level API through ``LlamaBackend``: our
  own batches, full-vocabulary logits only where a token is decided, rejected positions
  removed from the KV cache.

Also here: llama-cpp-python's own loop measured with the same clocks
(``generate_llama_cpp``), the verification costs of a model (``calibrate``, kept on
disk by ``verify_costs``) and the drafter that uses them (``adaptive_drafter``).
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import json
import os
import time
from typing import Sequence

import numpy as np

try:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaDraftModel
except ImportError:  # the loop still runs on any Backend; real models need the extra
    llama_cpp = None

    class LlamaDraftModel(abc.ABC):  # type: ignore[no-redef]
        """Stand-in for llama_cpp.llama_speculative.LlamaDraftModel."""

        @abc.abstractmethod
        def __call__(self, input_ids, /, **kwargs): ...

import ngramcache.decoding.loop as generation

import ngramcache.models as models
from ngramcache.integrations import exactness
from ngramcache.integrations.exactness import ExactnessReport, check_exact, no_weight_repacking
from ngramcache._validate import as_tokens, check_int
from ngramcache.drafters.base import Drafter, DraftStats
from ngramcache.files import atomic_open
from ngramcache.decoding.gate import AdaptiveGate, check_costs
from ngramcache.decoding.loop import Backend, GenerationResult

__all__ = [
    "LlamaDrafter", "generate", "stream", "make_llama", "check_llama", "default_threads",
    "verify_costs", "calibrate", "adaptive_drafter", "load_costs", "store_costs", "cost_store_path",
    "LlamaBackend", "CountingDraftModel", "generate_llama_cpp",
    "check_exact", "ExactnessReport", "no_weight_repacking",
]

#: at most this many threads by default: more rarely help a small model
MAX_DEFAULT_THREADS = 8


def _need_llama() -> None:
    if llama_cpp is None:
        raise ImportError("this needs llama-cpp-python: pip install 'ngramcache[llama]'")


def default_threads() -> int:
    """Threads for single tokens and batches alike: the usable CPUs, at most 8."""
    return min(models.usable_cpus(), MAX_DEFAULT_THREADS)


# ---------------------------------------------------------------------------------
# llama-cpp-python's own speculative path


def make_llama(model_path=None, drafter=None, *, n_ctx: int = 4096, n_batch: int = 512,
               n_threads: int | None = None, n_threads_batch: int | None = None,
               verbose: bool = False, exact: bool = True, **kwargs) -> "llama_cpp.Llama":
    """A ``llama_cpp.Llama`` configured for speculative decoding.

    ``drafter``: a ``LlamaDraftModel`` (e.g. ``LlamaDrafter``) or any ``Drafter``
    (wrapped in ``LlamaDrafter``); None for a model used with ``generate`` or alone.
    ``model_path``: a GGUF file or a packaged model's name (see
    :func:`ngramcache.models.model_path`); None means the packaged Gemma 3 270M.

    Known bug (llama-cpp-python 0.3.36): ``Llama(draft_model=..., logits_all=False)``
    with ``n_ctx > n_batch`` fails with "ValueError: could not broadcast input array
    ... into shape (0,)" as soon as the sequence passes ``n_batch`` tokens: a draft model
    forces full logits for every token, but the score buffer is sized for ``n_batch``
    rows when ``logits_all=False`` is passed. This helper passes ``logits_all=True``
    whenever there is a drafter (the same computation; the buffer then has ``n_ctx``
    rows, committed lazily) and refuses an explicit ``logits_all=False``.

    ``n_ctx`` is rounded up to a multiple of 256, as llama.cpp does anyway (otherwise
    llama-cpp-python's buffers would be smaller than the context it lets fill).

    Threads: llama-cpp-python defaults to ``n_threads = cpu_count // 2`` but
    ``n_threads_batch = cpu_count``, which makes batches look cheaper than single
    tokens; both default here to the usable cores (at most 8).

    Exact kernels (``exact=True``, the default): the weights are loaded without repacking
    and ggml's tiled matmul is switched off for the process before the first model loads
    (``ngramcache.integrations.exactness``), so that a batch's logits equal single-token
    logits bit for bit and speculative output equals plain decoding (docs/exactness.md).
    ``exact=False`` loads with llama-cpp-python's own defaults.
    """
    _need_llama()
    path = models.model_path(model_path)
    if drafter is not None and not isinstance(drafter, LlamaDraftModel):
        if not isinstance(drafter, Drafter):
            raise TypeError(f"drafter must be a LlamaDraftModel or a Drafter, got {type(drafter).__name__}")
        drafter = LlamaDrafter(drafter)
    n_ctx = check_int("n_ctx", n_ctx, 1)
    n_batch = check_int("n_batch", n_batch, 1)
    n_threads = check_int("n_threads", n_threads, 1, none_ok=True)
    n_threads_batch = check_int("n_threads_batch", n_threads_batch, 1, none_ok=True)
    # llama.cpp pads the context to a multiple of 256, but llama-cpp-python sizes its
    # token and logits buffers by the number asked for: ask for what will be given
    n_ctx = -(-n_ctx // 256) * 256
    if drafter is not None:
        if kwargs.get("logits_all") is False and n_ctx > n_batch:
            raise ValueError(
                "llama-cpp-python 0.3.36 fails with a draft model, logits_all=False and n_ctx > n_batch "
                "once the sequence passes n_batch tokens; use logits_all=True (the default here)")
        kwargs["logits_all"] = True
    n_threads = n_threads or default_threads()
    n_threads_batch = n_threads_batch or n_threads
    from llama_cpp._utils import suppress_stdout_stderr

    if exact:
        exactness.exact_kernels()
    # llama.cpp prints a few lines while loading even with verbose=False
    with suppress_stdout_stderr(disable=verbose), \
            exactness.no_weight_repacking() if exact else contextlib.nullcontext():
        return llama_cpp.Llama(model_path=path, draft_model=drafter, n_ctx=n_ctx, n_batch=n_batch,
                               n_threads=n_threads, n_threads_batch=n_threads_batch, verbose=verbose,
                               **kwargs)


def check_llama(llm) -> None:
    """Raise ValueError if ``llm`` has a draft model but would hit llama-cpp-python
    0.3.36's ``logits_all=False`` bug (see ``make_llama``)."""
    if getattr(llm, "draft_model", None) is not None and llm.scores.shape[0] < llm.n_ctx():
        raise ValueError(
            f"this Llama has a draft model but room for only {llm.scores.shape[0]} rows of logits "
            f"(n_ctx={llm.n_ctx()}): llama-cpp-python 0.3.36 then fails once the sequence passes "
            "n_batch tokens (ValueError: could not broadcast ... into shape (0,)). Create it with "
            "logits_all=True, or with ngramcache.integrations.llama.make_llama")


class LlamaDrafter(LlamaDraftModel):
    """Any ``Drafter`` as a llama-cpp-python draft model.

    llama-cpp-python passes the whole sequence (verified tokens plus the model's newest
    token) at every call. The adapter compares it with the previous call's sequence:
    when it extends it, only the new tokens go to the drafter (``accept``); otherwise
    (a new request, a rewind) the drafter restarts from the given sequence (``reset``).
    The comparison is a memcmp of the previous sequence, microseconds at 32k tokens;
    everything else is proportional to the new tokens.
    """

    def __init__(self, drafter: Drafter, n_max: int | None = None):
        if not isinstance(drafter, Drafter):
            raise TypeError(f"drafter must implement the Drafter protocol, got {type(drafter).__name__}")
        self.drafter = drafter
        self.n_max = check_int("n_max", n_max, 0, none_ok=True)
        self.resets = 0  # times the sequence was not an extension of the previous one
        self._seq = np.empty(1024, dtype=np.int32)
        self._n = 0

    @property
    def stats(self) -> DraftStats:
        """The wrapped drafter's counters."""
        return self.drafter.stats

    def _remember(self, ids: np.ndarray, start: int) -> None:
        if ids.size > self._seq.size:
            grown = np.empty(max(ids.size, 2 * self._seq.size), dtype=np.int32)
            grown[:start] = self._seq[:start]
            self._seq = grown
        self._seq[start : ids.size] = ids[start:]
        self._n = int(ids.size)

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        """The draft to follow ``input_ids`` (llama-cpp-python's call)."""
        ids = as_tokens(input_ids, "input_ids")
        n = self._n
        if n and ids.size >= n and np.array_equal(ids[:n], self._seq[:n]):
            if ids.size > n:
                self.drafter.accept(ids[n:])
            self._remember(ids, n)
        else:
            if n:
                self.resets += 1
            self.drafter.reset(ids)
            self._remember(ids, 0)
        out = self.drafter.propose(self.n_max) if self.n_max is not None else self.drafter.propose(
            getattr(self.drafter, "n_draft", 8))
        return np.asarray(out, dtype=np.intc)


# ---------------------------------------------------------------------------------
# ngramcache's loop on a Llama


class _Batch:
    """A llama_batch we fill ourselves: one sequence, chosen outputs."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.b = llama_cpp.llama_batch_init(capacity, 0, 1)

    def fill(self, tokens, pos0: int, logits_from: int) -> None:
        b = self.b
        n = len(tokens)
        b.n_tokens = n
        for i in range(n):
            b.token[i] = int(tokens[i])
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = i >= logits_from

    def free(self) -> None:
        if self.b is not None:
            llama_cpp.llama_batch_free(self.b)
            self.b = None

    def __del__(self):
        self.free()


class LlamaBackend:
    """A ``llama_cpp.Llama`` as an ``ngramcache.decoding.loop.Backend``, through llama.cpp's
    low-level API: our own batches, logits only where asked, KV-cache truncation with
    ``llama_memory_seq_rm``. Get it with ``LlamaBackend.of(llm)``."""

    def __init__(self, llm):
        _need_llama()
        if not isinstance(llm, llama_cpp.Llama):
            raise TypeError(f"llm must be a llama_cpp.Llama, got {type(llm).__name__}")
        self.llm = llm
        self.ctx = llm._ctx.ctx
        self.vocab = llm._model.vocab
        self.n_vocab = llm.n_vocab()
        self.n_ctx = llm.n_ctx()
        self.n_batch = llm.n_batch
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_swa = int(llama_cpp.llama_model_n_swa(llm._model.model)) if llm.context_params.swa_full is False else 0
        self._batch = _Batch(max(self.n_batch, 64))
        self._pieces: dict[int, bytes] = {}

    @classmethod
    def of(cls, llm) -> "LlamaBackend":
        """The backend of ``llm``, created once and kept on it."""
        b = getattr(llm, "_ngramcache_backend", None)
        if b is None:
            b = cls(llm)
            llm._ngramcache_backend = b
        return b

    def set_threads(self, n_threads: int | None, n_threads_batch: int | None) -> None:
        """Threads for single tokens and for batches (None: keep; ``n_threads_batch``
        None follows ``n_threads``)."""
        if n_threads is None and n_threads_batch is None:
            return
        nt = n_threads or self.llm.n_threads
        ntb = n_threads_batch or n_threads or self.llm.n_threads_batch
        llama_cpp.llama_set_n_threads(self.ctx, nt, ntb)

    def decode(self, tokens, pos0: int, logits_from: int) -> None:
        if len(tokens) > self.n_batch:
            # llama.cpp would abort the process (GGML_ASSERT), not return an error
            raise ValueError(f"cannot decode {len(tokens)} tokens at once: n_batch is {self.n_batch}")
        if len(tokens) > self._batch.capacity:
            self._batch.free()
            self._batch = _Batch(len(tokens))
        self._batch.fill(tokens, pos0, logits_from)
        rc = llama_cpp.llama_decode(self.ctx, self._batch.b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed (return code {rc})")

    def logits(self, i: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
        if not ptr:
            raise RuntimeError(f"no logits for batch index {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def truncate(self, pos: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self.mem, 0, pos, -1):
            raise RuntimeError(f"the KV cache refused to drop positions >= {pos}")

    def can_keep(self, n: int) -> bool:
        """Whether the KV cache can keep its first ``n`` positions and go on from there: a
        sliding-window cache (Gemma 3) has already dropped positions the next token would
        attend to once it went on more than a window past ``n``."""
        if not self.n_swa:
            return True
        pos_min = int(llama_cpp.llama_memory_seq_pos_min(self.mem, 0))
        return pos_min <= max(0, n - self.n_swa)

    def clear(self) -> None:
        # Llama's own bookkeeping no longer matches the KV cache after we use it
        self.llm.reset()
        llama_cpp.llama_memory_clear(self.mem, True)

    def is_eog(self, tok: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, tok))

    def piece(self, tok: int) -> bytes:
        p = self._pieces.get(tok)
        if p is None:
            buf = ctypes.create_string_buffer(256)
            n = llama_cpp.llama_token_to_piece(self.vocab, tok, buf, 256, 0, False)
            p = bytes(buf[: max(n, 0)])
            self._pieces[tok] = p
        return p

    def tokenize(self, prompt) -> np.ndarray:
        if isinstance(prompt, str):
            prompt = prompt.encode("utf-8")
        if isinstance(prompt, bytes):
            if not prompt:
                raise ValueError("prompt is empty")
            return np.asarray(self.llm.tokenize(prompt, add_bos=True, special=True), dtype=np.int32)
        arr = as_tokens(prompt, "prompt")
        if arr.size and int(arr.max()) >= self.n_vocab:
            raise ValueError(f"prompt: token id {int(arr.max())} is beyond the vocabulary ({self.n_vocab})")
        return arr


def _backend(llm) -> Backend:
    """The backend of a ``llama_cpp.Llama``, or ``llm`` itself when it is a Backend."""
    if llama_cpp is not None and isinstance(llm, llama_cpp.Llama):
        return LlamaBackend.of(llm)
    if not generation.is_backend(llm):
        raise TypeError(f"llm must be a llama_cpp.Llama or a Backend, got {type(llm).__name__}")
    return llm


def generate(llm, prompt, drafter: Drafter | None = None, max_tokens: int = 128, **kw) -> GenerationResult:
    """:func:`ngramcache.decoding.loop.generate` on a ``llama_cpp.Llama`` (through its
    ``LlamaBackend``) or on any ``Backend``; the same keyword arguments."""
    return generation.generate(_backend(llm), prompt, drafter, max_tokens, **kw)


def stream(llm, prompt, drafter: Drafter | None = None, max_tokens: int = 128, **kw) -> generation.stream:
    """:class:`ngramcache.decoding.loop.stream` on a ``llama_cpp.Llama`` or any ``Backend``:
    iterate over the text pieces, then read ``.result``."""
    return generation.stream(_backend(llm), prompt, drafter, max_tokens, **kw)


# ---------------------------------------------------------------------------------
# llama-cpp-python's own loop, measured with the same clocks (for comparisons)


class CountingDraftModel(LlamaDraftModel):
    """Wraps a llama-cpp-python draft model and records its proposals, so that drafted
    and accepted tokens can be counted once the output is known."""

    def __init__(self, inner: LlamaDraftModel):
        self.inner = inner
        self.proposals: list[tuple[int, np.ndarray]] = []
        self.seconds = 0.0

    def __call__(self, input_ids, /, **kwargs):
        """The inner model's draft, recorded."""
        t = time.perf_counter()
        out = self.inner(input_ids, **kwargs)
        self.seconds += time.perf_counter() - t
        self.proposals.append((len(input_ids), np.asarray(out, dtype=np.int32).copy()))
        return out

    def count(self, sequence: np.ndarray) -> tuple[int, int]:
        """(drafted, accepted) given the final prompt + output sequence."""
        drafted = accepted = 0
        for n, p in self.proposals:
            truth = sequence[n : n + p.size]
            m = min(truth.size, p.size)
            drafted += m  # proposals past the end of the output were never verified
            eq = p[:m] == truth[:m]
            accepted += int(m if eq.all() else np.argmin(eq))
        return drafted, accepted


def generate_llama_cpp(llm, prompt, max_tokens: int = 128, stop_at_eos: bool = True) -> GenerationResult:
    """Greedy generation with llama-cpp-python's own loop (``Llama.generate``, with the
    ``draft_model`` the ``Llama`` was built with, if any), measured like ``generate``:
    ``t_prompt`` is the time to the first token. Wrap the draft model in
    ``CountingDraftModel`` to get drafted/accepted counts."""
    _need_llama()
    max_tokens = check_int("max_tokens", max_tokens, 0)
    m = LlamaBackend.of(llm)
    check_llama(llm)
    prompt_tokens = m.tokenize(prompt)
    if prompt_tokens.size == 0:
        raise ValueError("prompt is empty")
    dm = llm.draft_model
    if isinstance(dm, CountingDraftModel):
        dm.proposals.clear()
        dm.seconds = 0.0
    out: list[int] = []
    stop_reason = "length"
    llm.reset()  # no reuse of a previous request's prompt
    t0 = time.perf_counter()
    t_prompt = 0.0
    if max_tokens > 0:
        for tok in llm.generate(prompt_tokens.tolist(), temp=0.0, repeat_penalty=1.0, reset=True):
            if not out:
                t_prompt = time.perf_counter() - t0
            out.append(int(tok))
            if stop_at_eos and m.is_eog(int(tok)):
                stop_reason = "eos"
                break
            if len(out) >= max_tokens:
                break
    t_total = time.perf_counter() - t0
    llm.reset()
    tokens = np.asarray(out, dtype=np.int32)
    drafted = accepted = 0
    t_draft = 0.0
    if isinstance(dm, CountingDraftModel):
        drafted, accepted = dm.count(np.concatenate([prompt_tokens, tokens]))
        t_draft = dm.seconds
    return GenerationResult.decoded(m, tokens, n_prompt=int(prompt_tokens.size), t_prompt=t_prompt,
                                    t_draft=t_draft, t_verify=t_total - t_prompt - t_draft, t_total=t_total,
                                    drafted=drafted, accepted=accepted, accept_lengths=[],
                                    stop_reason=stop_reason)


# ---------------------------------------------------------------------------------
# Verification costs, measured once per model and kept on disk


def cost_store_path() -> str:
    """Where verification costs are kept: ``verify-costs.json`` in $NGRAMCACHE_CACHE_DIR,
    else in ``ngramcache`` under $XDG_CACHE_HOME or ~/.cache."""
    base = os.environ.get("NGRAMCACHE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ngramcache")
    return os.path.join(base, "verify-costs.json")


def _cost_key(model_path: str, n_threads: int, n_threads_batch: int) -> str:
    st = os.stat(model_path)
    # v2: measured after 512 tokens of context (attention makes batches dearer with length)
    return f"v2|{os.path.abspath(model_path)}|{st.st_size}|{int(st.st_mtime)}|t{n_threads}|tb{n_threads_batch}"


def load_costs(model_path: str, n_threads: int, n_threads_batch: int, path: str | None = None) -> list[float] | None:
    """The verification costs stored for this model file (its path, size and time) and
    thread counts, or None."""
    path = path or cost_store_path()
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
        costs = table.get(_cost_key(model_path, n_threads, n_threads_batch))
    except (OSError, ValueError, AttributeError, RecursionError):  # RecursionError: JSON nested too deep
        return None
    if not isinstance(costs, list) or not costs:
        return None
    try:
        check_costs(costs)
    except (ValueError, TypeError):  # TypeError: an element that is no number (a dict ...)
        return None
    return [float(c) for c in costs]


def store_costs(model_path: str, n_threads: int, n_threads_batch: int, costs: Sequence[float],
                path: str | None = None) -> None:
    """Remember verification costs (atomically: temp file, fsync, rename); a damaged
    store is replaced."""
    path = path or cost_store_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
        if not isinstance(table, dict):
            table = {}
    except (OSError, ValueError, RecursionError):
        table = {}
    table[_cost_key(model_path, n_threads, n_threads_batch)] = [float(c) for c in costs]
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1, sort_keys=True)


# ---------------------------------------------------------------------------------
# Measuring verification costs, and the adaptive drafter


def calibrate(llm, max_batch: int = 9, repeats: int = 5, n_context: int = 512) -> list[float]:
    """Measure the time to verify batches of 1..``max_batch`` tokens (a decode with
    logits for every token plus the choice of a token from each row) after
    ``n_context`` tokens of context. Batch sizes are interleaved and each keeps the
    fastest of ``repeats`` rounds: load from other processes only ever adds time.
    Returns seconds per batch size."""
    m = _backend(llm)
    max_batch = check_int("max_batch", max_batch, 1, m.n_batch)
    repeats = check_int("repeats", repeats, 1)
    n_context = check_int("n_context", n_context, 1)
    n_context = max(1, min(n_context, m.n_ctx - max_batch))
    m.clear()
    ctx_toks = (np.arange(n_context, dtype=np.int64) * 7919 % min(m.n_vocab - 100, 30000) + 100).astype(np.int32)
    for s in range(0, n_context, m.n_batch):
        m.decode(ctx_toks[s : s + m.n_batch], s, m.n_batch)
    best = [float("inf")] * max_batch
    for r in range(repeats + 1):  # round 0 warms up
        for k in range(1, max_batch + 1):
            t = time.perf_counter()
            m.decode(ctx_toks[:k], n_context, 0)
            for i in range(k):
                int(np.argmax(m.logits(i)))
            dt = time.perf_counter() - t
            m.truncate(n_context)
            if r:
                best[k - 1] = min(best[k - 1], dt)
    m.clear()
    return best


def verify_costs(llm, max_batch: int = 9, refresh: bool = False) -> list[float]:
    """Verification costs for this model and thread setting: measured once
    (``calibrate``, a few seconds) and kept in ~/.cache/ngramcache/verify-costs.json
    (override the folder with $NGRAMCACHE_CACHE_DIR, see :func:`cost_store_path`)."""
    max_batch = check_int("max_batch", max_batch, 1)
    if llama_cpp is None or not isinstance(llm, llama_cpp.Llama):
        return calibrate(llm, max_batch)
    nt = llama_cpp.llama_n_threads(llm._ctx.ctx)
    ntb = llama_cpp.llama_n_threads_batch(llm._ctx.ctx)
    if not refresh:
        costs = load_costs(llm.model_path, nt, ntb)
        if costs is not None and len(costs) >= max_batch:
            return costs[:max_batch]
    costs = calibrate(llm, max_batch)
    try:
        store_costs(llm.model_path, nt, ntb, costs)
    except OSError:
        pass  # an unwritable cache only costs a recalibration next time
    return costs


def adaptive_drafter(llm, static=None, dynamic=None, n_draft: int = 16, ngram_min: int | None = None,
                     ngram_max: int | None = None, refresh: bool = False, copy: bool = True,
                     drafter: str | None = None, **options) -> Drafter:
    """ngramcache's drafter for ``llm``, with draft lengths that follow this model's
    verification costs (``verify_costs``) and the acceptance seen so far
    (``AdaptiveGate``).

    ``drafter``: a name of ``ngramcache.drafters.catalog.DRAFTERS`` (default
    ``catalog.DEFAULT_DRAFTER``; ``copy=False`` without a name: ``lookup``), built with
    ``options`` (its constructor's keywords); ``static``, ``dynamic``, ``ngram_min`` and
    ``ngram_max`` apply to ``lookup`` and ``copy``."""
    from ngramcache.drafters.catalog import DEFAULT_DRAFTER, make_drafter

    n_draft = check_int("n_draft", n_draft, 0)
    if drafter is None:
        drafter = DEFAULT_DRAFTER if copy else "lookup"
    n_batch = _backend(llm).n_batch
    costs = verify_costs(llm, max_batch=min(n_draft + 1, n_batch), refresh=refresh) if n_draft > 0 else [1.0]
    return make_drafter(drafter, n_draft=n_draft, gate=AdaptiveGate(costs), static=static, dynamic=dynamic,
                        ngram_min=ngram_min, ngram_max=ngram_max, **options)
