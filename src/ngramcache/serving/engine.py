"""Serving many requests with one model: the engine behind ``serve`` and ``chat``.

* :class:`Memory` is what the drafters learn across requests: the dynamic n-gram cache
  (``copy``, ``lookup``), the ngram-mod table (``mod``) and the suffix store
  (``suffix``), all fed with every request's prompt and response, bounded by a token
  budget (the oldest requests are forgotten first), saved to one file atomically.
* :class:`Engine` owns a ``llama_cpp.Llama`` and runs :class:`Job` objects one at a time,
  first come first served, on a worker thread: one decode at a time is what a CPU
  can do. A job streams its text through a callback, can be cancelled at any step
  (a client went away), and reuses the KV cache of the previous job for the prefix it
  shares with it (the next turn of a chat decodes only the new tokens).
* :class:`ChatTemplate` renders messages with the model's own chat template from its
  GGUF metadata, through llama-cpp-python's Jinja2 formatter.

No web framework here: ``ngramcache.serving.app`` puts an HTTP API on top.
"""

from __future__ import annotations

import codecs
import collections
import hashlib
import os
import queue
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ngramcache._validate import as_tokens, check_int
from ngramcache.cache import NgramCache
from ngramcache._core import CacheFormatError
from ngramcache.files import atomic_open
from ngramcache.decoding.loop import PromptCache
from ngramcache.drafters.llama_ngram import MOD_TABLE_SIZE, NgramModDrafter, NgramModTable
from ngramcache.drafters.suffix import SuffixStore

__all__ = ["Memory", "Engine", "Job", "JobResult", "ChatTemplate", "EngineError", "vocab_fingerprint"]

_MEM_MAGIC = b"NGSRVMEM"
_MEM_VERSION = 1
# magic, version, n_vocab, vocabulary fingerprint, n_requests, n_tokens, mod table slots
_MEM_HEADER = struct.Struct("<8sII32sQQQ")


class EngineError(Exception):
    """A request the engine cannot run as asked (the message says why)."""


def vocab_fingerprint(backend) -> bytes:
    """SHA-256 of every token's bytes: memory saved with one vocabulary is refused by
    another (its token ids would mean other text)."""
    h = hashlib.sha256()
    for t in range(backend.n_vocab):
        p = backend.piece(t)
        h.update(struct.pack("<I", len(p)))
        h.update(p)
    return h.digest()


class Memory:
    """What the drafters learn across requests, bounded by ``max_tokens`` tokens of
    history (prompt + response of each request; the oldest requests are forgotten
    first, and the dynamic cache is rebuilt from what is kept).

    ``dynamic``: the n-gram counts of the history (llama.cpp's dynamic cache) for
    ``copy`` and ``lookup``; ``suffix``: a ``SuffixStore`` of the history for
    ``suffix``; ``mod``: an ``NgramModTable`` (fixed size) for ``mod``. Not thread-safe
    on its own: the engine's worker is its only user.
    """

    def __init__(self, max_tokens: int = 1_000_000, mod_size: int = MOD_TABLE_SIZE, ngram_min: int = 1,
                 ngram_max: int = 4):
        self.max_tokens = check_int("max_tokens", max_tokens, 1)
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.dynamic = NgramCache()
        self.suffix = SuffixStore(max_tokens=self.max_tokens)
        self.mod = NgramModTable(mod_size)
        self._history: collections.deque[np.ndarray] = collections.deque()
        self._n_tokens = 0
        self.learned = 0  # requests learned since start or load

    @property
    def n_tokens(self) -> int:
        """Tokens of history kept."""
        return self._n_tokens

    @property
    def n_requests(self) -> int:
        """Requests kept."""
        return len(self._history)

    @property
    def nbytes(self) -> int:
        """Bytes held: the caches, the store, the table and the history."""
        return int(self.dynamic.nbytes + self.suffix.nbytes + self.mod.nbytes + 4 * self._n_tokens)

    def drafter_options(self, drafter: str) -> dict:
        """The shared state drafter ``drafter`` reads, as its constructor's keywords."""
        if drafter in ("copy", "lookup"):
            return {"dynamic": self.dynamic}
        if drafter == "suffix":
            return {"store": self.suffix}
        if drafter == "mod":
            return {"table": self.mod}
        return {}

    def learn(self, tokens, mod_learned: bool = False) -> None:
        """Remember one request (its prompt and response). ``mod_learned``: the request
        was drafted with ngram-mod on this table, which learned it already."""
        toks = as_tokens(tokens, "tokens").copy()
        if toks.size == 0:
            return
        if toks.size > self.max_tokens:
            toks = toks[-self.max_tokens:]
        self._history.append(toks)
        self._n_tokens += int(toks.size)
        self.suffix.add(toks)
        if not mod_learned:
            NgramModDrafter(table=self.mod).reset(toks)
        if self._n_tokens > self.max_tokens:
            # forget down to 3/4 of the budget, so that the rebuild is paid once per
            # quarter of the budget learned, not once per request
            while self._history and self._n_tokens > self.max_tokens * 3 // 4:
                self._n_tokens -= int(self._history.popleft().size)
            self._rebuild_dynamic()
        else:
            self.dynamic.update(toks, self.ngram_min, self.ngram_max)
        self.learned += 1

    def _rebuild_dynamic(self) -> None:
        self.dynamic.clear()
        for toks in self._history:
            self.dynamic.update(toks, self.ngram_min, self.ngram_max)

    def clear(self) -> None:
        """Forget everything."""
        self._history.clear()
        self._n_tokens = 0
        self.dynamic.clear()
        self.suffix.clear()
        self.mod.reset()

    def save(self, path: str | os.PathLike, n_vocab: int, fingerprint: bytes) -> None:
        """Write the memory to ``path`` atomically (temp file, fsync, rename): a save
        that is interrupted leaves the previous file whole. Format: ``NGSRVMEM``, version,
        the vocabulary (size and fingerprint), each request's length, the tokens, the
        ngram-mod slots, a CRC-32 of everything before it; little-endian."""
        lengths = np.array([t.size for t in self._history], dtype="<u4")
        tokens = np.concatenate(list(self._history)).astype("<i4") if self._history else np.zeros(0, "<i4")
        slots = self.mod._core.entries().astype("<i4")
        header = _MEM_HEADER.pack(_MEM_MAGIC, _MEM_VERSION, n_vocab, fingerprint, lengths.size, tokens.size,
                                  slots.size)
        crc = 0
        with atomic_open(path, "wb") as f:
            for part in (header, lengths.tobytes(), tokens.tobytes(), slots.tobytes()):
                f.write(part)
                crc = zlib.crc32(part, crc)
            f.write(struct.pack("<I", crc))

    @classmethod
    def load(cls, path: str | os.PathLike, n_vocab: int, fingerprint: bytes, max_tokens: int = 1_000_000,
             ngram_min: int = 1, ngram_max: int = 4) -> "Memory":
        """The memory saved at ``path``. A damaged, truncated or foreign file, or one
        saved with another vocabulary, raises ``CacheFormatError`` naming the problem."""
        name = os.fspath(path)
        with open(name, "rb") as f:
            data = f.read()
        if len(data) < _MEM_HEADER.size + 4:
            raise CacheFormatError(f"{name}: not a server memory file (truncated: {len(data)} bytes)")
        magic, version, nv, fp, n_req, n_tok, n_slots = _MEM_HEADER.unpack_from(data)
        if magic != _MEM_MAGIC:
            raise CacheFormatError(f"{name}: not a server memory file (magic {magic!r}, expected {_MEM_MAGIC!r})")
        if version != _MEM_VERSION:
            raise CacheFormatError(f"{name}: memory file version {version} is not supported (this is {_MEM_VERSION})")
        expected = _MEM_HEADER.size + 4 * (n_req + n_tok + n_slots) + 4
        if len(data) != expected:
            raise CacheFormatError(f"{name}: {len(data)} bytes, the header promises {expected} (truncated?)")
        (crc,) = struct.unpack_from("<I", data, len(data) - 4)
        if zlib.crc32(memoryview(data)[:-4]) != crc:
            raise CacheFormatError(f"{name}: damaged memory file (checksum mismatch)")
        if nv != n_vocab or fp != fingerprint:
            raise CacheFormatError(f"{name}: saved with another model's vocabulary ({nv} tokens); "
                                   f"this model has {n_vocab}: its token ids would mean other text")
        if n_slots == 0:
            raise CacheFormatError(f"{name}: the ngram-mod table has no slots")
        off = _MEM_HEADER.size
        lengths = np.frombuffer(data, dtype="<u4", count=n_req, offset=off).astype(np.int64)
        off += 4 * n_req
        tokens = np.frombuffer(data, dtype="<i4", count=n_tok, offset=off).astype(np.int32)
        off += 4 * n_tok
        slots = np.frombuffer(data, dtype="<i4", count=n_slots, offset=off).astype(np.int32)
        if int(lengths.sum()) != n_tok:
            raise CacheFormatError(f"{name}: request lengths add up to {int(lengths.sum())} tokens, not {n_tok}")
        if n_tok and (int(tokens.min()) < 0 or int(tokens.max()) >= n_vocab):
            raise CacheFormatError(f"{name}: token ids outside the vocabulary")
        if int(slots.min()) < -1 or int(slots.max()) >= n_vocab:
            raise CacheFormatError(f"{name}: ngram-mod slots hold ids outside the vocabulary")
        mem = cls(max_tokens=max_tokens, mod_size=int(n_slots), ngram_min=ngram_min, ngram_max=ngram_max)
        mem.mod._core.set_entries(slots)
        ends = np.cumsum(lengths)
        for end, n in zip(ends, lengths):
            toks = tokens[end - n : end]
            mem._history.append(toks)
            mem._n_tokens += int(n)
            mem.suffix.add(toks)
        while mem._history and mem._n_tokens > mem.max_tokens:
            mem._n_tokens -= int(mem._history.popleft().size)
        mem._rebuild_dynamic()
        return mem

    def __repr__(self) -> str:
        return f"<Memory {self.n_requests} requests, {self._n_tokens} tokens, {self.nbytes} bytes>"


class ChatTemplate:
    """Messages to a prompt with a model's own chat template (Jinja2, rendered by
    llama-cpp-python's ``Jinja2ChatFormatter``, as its server does)."""

    def __init__(self, template: str, bos_token: str, eos_token: str):
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.template = template
        self.bos_token = bos_token
        self._formatter = Jinja2ChatFormatter(template=template, eos_token=eos_token, bos_token=bos_token)

    @classmethod
    def of(cls, llm, template: str | None = None) -> "ChatTemplate | None":
        """The template of ``llm``'s GGUF (``tokenizer.chat_template``) or ``template``;
        None when the model has none."""
        template = template or llm.metadata.get("tokenizer.chat_template")
        if not template:
            return None
        model = llm._model

        def text(tok: int) -> str:
            return model.token_get_text(tok) if tok != -1 else ""

        return cls(template, text(llm.token_bos()), text(llm.token_eos()))

    def render(self, messages: list[dict]) -> str:
        """The prompt for ``messages`` (``role`` and ``content`` each), ending where the
        assistant's answer starts. A template error is a ValueError."""
        try:
            return self._formatter(messages=messages).prompt
        except Exception as e:  # jinja2 errors and the template's own raise_exception
            raise ValueError(f"the chat template cannot render these messages: {e}") from None


# ---------------------------------------------------------------------------------
# jobs


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
            "acceptance": round(self.acceptance, 4), "prompt_tokens_cached": self.n_cached,
            "t_queue": round(self.t_queue, 6), "t_prompt": round(self.t_prompt, 6),
            "t_draft": round(self.t_draft, 6), "t_verify": round(self.t_verify, 6),
            "t_total": round(self.t_total, 6),
            "tokens_per_s": round(self.n_tokens / gen, 3) if gen > 0 and self.n_tokens > 1 else None,
        }


@dataclass
class Job:
    """One request for the engine.

    ``prompt``: token ids. ``on_text(text, from_draft)`` receives the text as it is
    settled, in pieces, each marked whether its tokens came from accepted drafts
    (called on the worker thread). ``speculative``: None for the engine's defaults, else
    ``{"enabled": bool, "drafter": name, "n_draft": int}`` (any subset).
    ``cache_prompt``: reuse the KV cache for the shared prefix (see docs/serve.md on
    numerics). Wait for ``done`` (or be called back by ``on_done``, on the worker thread);
    then read ``result`` or ``error``."""

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

    def cancel(self) -> None:
        """Stop at the next step (or never start)."""
        self.cancelled.set()


class _StopFilter:
    """Holds back text that could be the start of a stop string; finds the first stop."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.text = []  # text let through
        self.stopped = False

    def feed(self, s: str) -> str:
        """The part of ``s`` that is safe to hand out now."""
        if self.stopped:
            return ""
        buf = self.pending + s
        cut = min((i for i in (buf.find(st) for st in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self.pending = ""
            out = buf[:cut]
        elif self.hold and len(buf) > self.hold:
            out, self.pending = buf[: -self.hold], buf[-self.hold :]
        elif self.hold:
            out, self.pending = "", buf
        else:
            out = buf
        self.text.append(out)
        return out

    def flush(self) -> str:
        out, self.pending = ("" if self.stopped else self.pending), ""
        self.text.append(out)
        return out


class Engine:
    """One model serving jobs in order (see the module's docstring).

    ``drafter``: the default drafter's name (``ngramcache.drafters.catalog``); ``n_draft``: its
    longest draft; ``drafter_options``: its options; ``adaptive``: draft lengths that
    follow this model's verification costs (measured once, see
    ``ngramcache.integrations.llama.verify_costs``); ``memory``: a :class:`Memory` the drafters share
    across requests (None: each request drafts from itself alone);
    ``memory_path`` / ``save_every``: where and how often (seconds) the memory is saved
    between jobs (and at ``close``)."""

    def __init__(self, llm, *, model_name: str = "model", drafter: str | None = "copy", n_draft: int = 16,
                 drafter_options: dict | None = None, adaptive: bool = True, memory: Memory | None = None,
                 memory_path: str | os.PathLike | None = None, save_every: float | None = None,
                 chat_template: ChatTemplate | None = None):
        import ngramcache.integrations.llama as nl
        from ngramcache.drafters.catalog import DRAFTERS

        if drafter is not None and drafter not in DRAFTERS:
            raise ValueError(f"unknown drafter {drafter!r}: choose one of {', '.join(DRAFTERS)}")
        self.llm = llm
        self.backend = nl.LlamaBackend.of(llm)
        self.model_name = model_name
        self.drafter = drafter
        self.n_draft = check_int("n_draft", n_draft, 0, 256)
        self.drafter_opts = dict(drafter_options or {})
        self.memory = memory
        self.memory_path = None if memory_path is None else os.fspath(memory_path)
        self.save_every = save_every
        self.chat_template = chat_template if chat_template is not None else ChatTemplate.of(llm)
        self.prompt_cache = PromptCache()
        self.costs = None
        self.temperature = 0.0  # for requests that give none
        if adaptive:
            self.costs = nl.verify_costs(llm, max_batch=min(self.n_draft + 1, self.backend.n_batch)) if self.n_draft else None
        self._fingerprint: bytes | None = None
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()  # the counters
        self.counters = collections.Counter()
        self.seconds = collections.Counter()
        self.running: Job | None = None
        self.saves = 0
        self.save_errors: list[str] = []
        self._last_save = time.monotonic()
        self._worker = threading.Thread(target=self._work, name="ngramcache-engine", daemon=True)
        self._closed = False
        self._worker.start()

    # -- the outside --------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self.backend.n_ctx

    @property
    def queued(self) -> int:
        """Jobs waiting (not counting the running one)."""
        return self._queue.qsize()

    def fingerprint(self) -> bytes:
        if self._fingerprint is None:
            self._fingerprint = vocab_fingerprint(self.backend)
        return self._fingerprint

    def tokenize(self, text: str, special: bool = True) -> np.ndarray:
        """Text to token ids (BOS added where the model wants one and the text has none)."""
        bos = self.chat_template.bos_token if self.chat_template is not None else ""
        add_bos = not (bos and text.startswith(bos))
        return np.asarray(self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special),
                          dtype=np.int32)

    def check_tokens(self, tokens) -> np.ndarray:
        """Token ids from a request, checked against the vocabulary."""
        arr = as_tokens(tokens, "prompt")
        if arr.size and int(arr.max()) >= self.backend.n_vocab:
            raise EngineError(f"prompt: token id {int(arr.max())} is beyond the vocabulary ({self.backend.n_vocab})")
        return arr

    def submit(self, job: Job) -> Job:
        """Queue ``job`` (it runs after every job queued before it)."""
        if self._closed:
            raise EngineError("the server is shutting down")
        self._check(job)
        job.submitted = time.perf_counter()
        self._queue.put(job)
        return job

    def run(self, job: Job, timeout: float | None = None) -> JobResult:
        """Queue ``job`` and wait for its result (its error is raised here)."""
        self.submit(job)
        if not job.done.wait(timeout):
            job.cancel()
            raise TimeoutError("the job did not finish in time")
        if job.error is not None:
            raise job.error
        return job.result

    def close(self, timeout: float | None = None) -> None:
        """Finish the running job, cancel the queued ones, save the memory (if a path
        was given), stop the worker."""
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                j = self._queue.get_nowait()
            except queue.Empty:
                break
            if j is not None:
                j.cancel()
                self._finish(j, error=EngineError("the server is shutting down"))
        self._queue.put(None)
        self._worker.join(timeout)

    def save_memory(self) -> bool:
        """Save the memory now, on the calling thread: call it only when no job runs
        (the worker does, between jobs)."""
        if self.memory is None or self.memory_path is None:
            return False
        self.memory.save(self.memory_path, self.backend.n_vocab, self.fingerprint())
        self.saves += 1
        self._last_save = time.monotonic()
        return True

    # -- the worker ---------------------------------------------------------------------

    def _check(self, job: Job) -> None:
        if not isinstance(job, Job):
            raise TypeError(f"job must be a Job, got {type(job).__name__}")
        n = int(job.prompt.size)
        if n == 0:
            raise EngineError("the prompt is empty")
        if n >= self.n_ctx:
            raise EngineError(f"the prompt has {n} tokens; the context holds {self.n_ctx}")
        if job.max_tokens < 0:
            raise EngineError("max_tokens must be >= 0")
        if n + job.max_tokens > self.n_ctx:
            raise EngineError(f"max_tokens {job.max_tokens} + {n} prompt tokens exceed the context of "
                              f"{self.n_ctx} tokens")
        self._speculative(job)  # its errors, now rather than on the worker

    def _speculative(self, job: Job) -> tuple[str | None, int]:
        from ngramcache.drafters.catalog import DRAFTERS

        spec = job.speculative or {}
        unknown = set(spec) - {"enabled", "drafter", "n_draft"}
        if unknown:
            raise EngineError(f"speculative: unknown field(s) {', '.join(sorted(unknown))} "
                              "(known: enabled, drafter, n_draft)")
        enabled = spec.get("enabled", True)
        if not isinstance(enabled, bool):
            raise EngineError("speculative.enabled must be true or false")
        name = spec.get("drafter", self.drafter)
        if name is not None and name not in DRAFTERS:
            raise EngineError(f"speculative.drafter: unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
        n_draft = spec.get("n_draft", self.n_draft)
        if isinstance(n_draft, bool) or not isinstance(n_draft, int) or not 0 <= n_draft <= 256:
            raise EngineError(f"speculative.n_draft must be an integer in [0, 256], got {n_draft!r}")
        if not enabled or name is None or n_draft == 0:
            return None, 0
        return name, n_draft

    def _make_drafter(self, name: str, n_draft: int):
        from ngramcache.drafters.catalog import make_drafter
        from ngramcache.decoding.gate import AdaptiveGate

        gate = None
        if self.costs is not None:
            costs = self.costs
            if len(costs) < n_draft + 1:  # a longer draft than measured: extend linearly
                step = costs[-1] - costs[-2] if len(costs) > 1 else costs[-1]
                costs = list(costs) + [costs[-1] + step * (i + 1) for i in range(n_draft + 1 - len(costs))]
            gate = AdaptiveGate(costs[: n_draft + 1])
        opts = dict(self.drafter_opts) if name == self.drafter else {}
        if self.memory is not None:
            opts.update(self.memory.drafter_options(name))
        return make_drafter(name, n_draft=n_draft, gate=gate, **opts)

    def _work(self) -> None:
        while True:
            timeout = None
            if self.save_every and self.memory is not None and self.memory_path is not None:
                timeout = max(0.05, self.save_every - (time.monotonic() - self._last_save))
            try:
                job = self._queue.get(timeout=timeout)
            except queue.Empty:
                job = False
            if job is None:
                break
            if job is not False:
                self._run(job)
            if (self.save_every and self.memory is not None and self.memory_path is not None
                    and time.monotonic() - self._last_save >= self.save_every and self.memory.learned):
                self._save_quietly()
        if self.memory is not None and self.memory_path is not None:
            self._save_quietly()

    def _save_quietly(self) -> None:
        try:
            self.save_memory()
        except OSError as e:  # a full disk must not stop the server; the old file is intact
            self.save_errors.append(str(e))
            self._last_save = time.monotonic()

    def _finish(self, job: Job, result: JobResult | None = None, error: BaseException | None = None) -> None:
        job.result = result
        job.error = error
        job.done.set()
        if job.on_done is not None:
            job.on_done()

    def _run(self, job: Job) -> None:
        from ngramcache.decoding.loop import generate

        t_queue = time.perf_counter() - job.submitted
        if job.cancelled.is_set():
            self._count(cancelled=1)
            self._finish(job, error=EngineError("cancelled before it started"))
            return
        self.running = job
        try:
            name, n_draft = self._speculative(job)
            drafter = self._make_drafter(name, n_draft) if name is not None else None
            stops = _StopFilter(job.stop)
            dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
            piece, is_eog = self.backend.piece, self.backend.is_eog
            emit = job.on_text

            def on_tokens(tokens, n_from_draft):
                for part, drafted in ((tokens[:n_from_draft], True), (tokens[n_from_draft:], False)):
                    if len(part) == 0:
                        continue
                    # an end-of-generation token ends the text; its own bytes are not text
                    raw = b"".join(piece(int(t)) for t in part if not is_eog(int(t)))
                    text = stops.feed(dec.decode(raw))
                    if text and emit is not None:
                        emit(text, drafted)
                    if stops.stopped:
                        return True
                return job.cancelled.is_set()

            res = generate(self.backend, job.prompt, drafter, job.max_tokens, temperature=job.temperature,
                           seed=job.seed, top_k=job.top_k, top_p=job.top_p, on_tokens=on_tokens,
                           prompt_cache=self.prompt_cache if job.cache_prompt else None)
            if not job.cache_prompt:
                self.prompt_cache.clear()  # the KV cache now holds this request, untracked
            tail = stops.feed(dec.decode(b"", final=True)) + stops.flush()
            if tail and emit is not None:
                emit(tail, False)
            if job.cancelled.is_set():
                reason = "cancelled"
            elif res.stop_reason in ("eos", "stop"):
                reason = "stop"
            else:
                reason = "length"
            result = JobResult(text="".join(stops.text), tokens=res.tokens, n_prompt=res.n_prompt,
                               n_cached=res.n_cached, finish_reason=reason, drafter=name, drafted=res.drafted,
                               accepted=res.accepted, t_prompt=res.t_prompt, t_draft=res.t_draft,
                               t_verify=res.t_verify, t_total=res.t_total, t_queue=t_queue)
            if self.memory is not None and job.learn and reason != "cancelled":
                self.memory.learn(np.concatenate([job.prompt, res.tokens]), mod_learned=name == "mod")
            self._count(result=result)
            self._finish(job, result=result)
        except BaseException as e:  # the job's error, never the worker's end
            self.prompt_cache.clear()
            self._count(failed=1)
            self._finish(job, error=e)
        finally:
            self.running = None

    def _count(self, result: JobResult | None = None, cancelled: int = 0, failed: int = 0) -> None:
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
