"""Serving many requests with one model: the engine behind ``serve`` and ``chat``.

:class:`Engine` runs :class:`~ngramcache.serving.jobs.Job` objects on a model
(an ``ngramcache.decoding.loop.Backend``; a ``llama_cpp.Llama`` is used through
``ngramcache.integrations.llama.LlamaBackend``) one at a time, first come first served,
on a worker thread: one decode at a time is what a CPU can do. A job streams its text
through a callback, can be cancelled at any step (a client went away, the server is
shutting down), and reuses the KV cache of the previous job for the prefix it shares with
it (the next turn of a chat decodes only the new tokens). The drafters share a
:class:`~ngramcache.serving.memory.Memory` across jobs, saved between jobs and at
``close``.

No web framework here: ``ngramcache.serving.app`` puts an HTTP API on top. The engine's
errors are typed (``ngramcache.serving.errors``): each says which HTTP status answers it.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Callable

import numpy as np

from ngramcache._validate import as_tokens, check_int
from ngramcache.defaults import MAX_DECODE_DRAFT, N_DRAFT
from ngramcache.decoding.gate import why_no_drafts
from ngramcache.decoding.loop import PromptCache, is_backend
from ngramcache.decoding.text_sink import TextSink
from ngramcache.serving.chat_template import ChatTemplate, tokenize_rendered
from ngramcache.serving.conversations import ConversationGates
from ngramcache.serving.errors import (CancelledError, ContextOverflowError, EngineError, QueueFullError,
                                       RequestError, ShuttingDownError)
from ngramcache.serving.drafting import resolve_speculative
from ngramcache.serving.jobs import Job, JobResult
from ngramcache.serving.memory import Memory, vocab_fingerprint
from ngramcache.serving.metrics import Tally
from ngramcache.serving.stop_filter import StopFilter

__all__ = ["Engine", "resolve_speculative", "Memory", "Job", "JobResult", "ChatTemplate", "EngineError",
           "vocab_fingerprint"]

log = logging.getLogger("ngramcache.serving")

def _llama_parts(llm, chat_template: ChatTemplate | None):
    """(backend, tokenize, chat template) of a ``llama_cpp.Llama``: its LlamaBackend, and
    text to ids with a BOS only where the text (a rendered template) has none."""
    import ngramcache.integrations.llama as nl

    backend = nl.LlamaBackend.of(llm)
    template = chat_template if chat_template is not None else ChatTemplate.of(llm)
    bos = template.bos_token if template is not None else ""
    return backend, lambda text: tokenize_rendered(llm, text, bos), template


class Engine:
    """One model serving jobs in order (see the module's docstring).

    ``model``: a ``Backend``, or a ``llama_cpp.Llama`` (its ``LlamaBackend``, its
    tokenizer and the chat template of its GGUF). ``tokenize``: text to token ids
    (default: the backend's). ``drafter``: the default drafter's name
    (``ngramcache.drafters.catalog``); ``n_draft``: its longest draft;
    ``drafter_options``: its options; ``adaptive``: draft lengths that follow this
    model's verification costs (learnt while serving, see
    ``ngramcache.integrations.llama.learned_costs``); ``memory``: a :class:`Memory` the
    drafters share across requests (None: each request drafts from itself alone);
    ``memory_path`` / ``save_every``: where and how often (seconds) the memory is saved
    between jobs (and at ``close``); ``static``: a static table (or ``NgramCache``) for
    the drafters that read one; ``max_queue``: jobs that may wait (None: no bound)."""

    def __init__(self, model, *, tokenize: Callable[[str], np.ndarray] | None = None, model_name: str = "model",
                 drafter: str | None = "copy", n_draft: int = N_DRAFT, drafter_options: dict | None = None,
                 adaptive: bool = True, memory: Memory | None = None, memory_path: str | os.PathLike | None = None,
                 save_every: float | None = None, chat_template: ChatTemplate | None = None, static=None,
                 max_queue: int | None = None):
        from ngramcache.drafters import registry

        if drafter is not None:
            registry.spec(drafter)  # an unknown name: a ValueError naming the choices
        self.llm = None
        if is_backend(model):
            self.backend = model
            self.chat_template = chat_template
            self._tokenize = tokenize or model.tokenize
        else:
            self.llm = model
            self.backend, llama_tokenize, self.chat_template = _llama_parts(model, chat_template)
            self._tokenize = tokenize or llama_tokenize
        self.model_name = model_name
        self.drafter = drafter
        self.n_draft = check_int("n_draft", n_draft, 0, MAX_DECODE_DRAFT)
        self.drafter_opts = dict(drafter_options or {})
        self.memory = memory
        self.memory_path = None if memory_path is None else os.fspath(memory_path)
        self.save_every = save_every
        self.static = static
        self.max_queue = check_int("max_queue", max_queue, 1, none_ok=True)
        self.prompt_cache = PromptCache()
        self.conversations = ConversationGates()  # the drafting gate's state per conversation
        # the cost curve every conversation's gate decides on and learns into (one machine)
        self.costs = None
        self.temperature = 0.0  # for requests that give none
        if adaptive and self.n_draft:
            from ngramcache.integrations.llama import learned_costs

            self.costs = learned_costs(self.llm if self.llm is not None else self.backend,
                                       max_batch=min(self.n_draft + 1, self.backend.n_batch))
        self._fingerprint: bytes | None = None
        self._max_token_bytes: int | None = None
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._submit_lock = threading.Lock()  # closing and queueing, one at a time
        self.tally = Tally()
        self.running: Job | None = None
        self.saves = 0
        self.save_errors: list[str] = []
        self.last_save_error: str | None = None  # of the latest save, None once one succeeds
        self._last_save = time.monotonic()
        self._learned_at_save = 0  # memory.learned when it was last saved (or loaded)
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

    @property
    def closed(self) -> bool:
        """Whether the engine refuses new jobs (``close`` was called)."""
        return self._closed

    def fingerprint(self) -> bytes:
        """The vocabulary's fingerprint (``vocab_fingerprint``), computed once."""
        if self._fingerprint is None:
            self._fingerprint = vocab_fingerprint(self.backend)
        return self._fingerprint

    def tokenize(self, text: str) -> np.ndarray:
        """Text to token ids (BOS added where the model wants one and the text has none)."""
        return np.asarray(self._tokenize(text), dtype=np.int32)

    @property
    def max_token_bytes(self) -> int | None:
        """The most bytes of text one token can stand for (its longest piece, special
        tokens written out), computed once; None when the model cannot say."""
        if self._max_token_bytes is None:
            self._max_token_bytes = _longest_piece(self.llm, self.backend)
        return self._max_token_bytes or None

    def check_text_fits(self, n_bytes: int, param: str = "prompt") -> None:
        """``ContextOverflowError`` for a text of ``n_bytes`` UTF-8 bytes that cannot fit in
        the context whatever its tokens: refused by its length alone, before any tokenizer
        work (a 16 MB prompt costs seconds and gigabytes to tokenize)."""
        most = self.max_token_bytes
        if most is not None and n_bytes > most * self.n_ctx:
            raise ContextOverflowError(f"the prompt is {n_bytes:,} bytes: no text that long fits the context of "
                                       f"{self.n_ctx} tokens (a token stands for at most {most} bytes)",
                                       param=param)

    def check_tokens(self, tokens) -> np.ndarray:
        """Token ids from a request, checked against the vocabulary (``RequestError``)."""
        try:
            arr = as_tokens(tokens, "prompt")
        except (TypeError, ValueError) as e:
            raise RequestError(str(e), param="prompt") from None
        if arr.size and int(arr.max()) >= self.backend.n_vocab:
            raise RequestError(f"prompt: token id {int(arr.max())} is beyond the vocabulary "
                               f"({self.backend.n_vocab})", param="prompt")
        return arr

    def check(self, job: Job) -> None:
        """Raise the ``EngineError`` that ``submit`` would for ``job``, and settle its
        drafting (``job.plan``)."""
        if not isinstance(job, Job):
            raise TypeError(f"job must be a Job, got {type(job).__name__}")
        n = int(job.prompt.size)
        if n == 0:
            raise RequestError("the prompt is empty", param="prompt")
        if n >= self.n_ctx:
            raise ContextOverflowError(f"the prompt has {n} tokens; the context holds {self.n_ctx}", param="prompt")
        if isinstance(job.max_tokens, bool) or not isinstance(job.max_tokens, int) or job.max_tokens < 0:
            raise RequestError(f"max_tokens must be an integer >= 0, got {job.max_tokens!r}", param="max_tokens")
        if n + job.max_tokens > self.n_ctx:
            raise ContextOverflowError(f"max_tokens {job.max_tokens} + {n} prompt tokens exceed the context of "
                                       f"{self.n_ctx} tokens", param="max_tokens")
        job.plan = resolve_speculative(job.speculative, self.drafter, self.n_draft)

    def submit(self, job: Job) -> Job:
        """Check ``job`` and queue it (it runs after every job queued before it).
        Raises ``RequestError`` for a job that cannot run, ``ShuttingDownError`` once the
        engine is closing, ``QueueFullError`` when ``max_queue`` jobs wait already."""
        self.check(job)
        with self._submit_lock:
            if self._closed:
                raise ShuttingDownError("the server is shutting down")
            if self.max_queue is not None and self._queue.qsize() >= self.max_queue:
                raise QueueFullError(f"{self._queue.qsize()} requests are waiting already (the most "
                                     f"this server queues); try again later")
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

    def close(self, drain: float | None = None, timeout: float | None = None) -> bool:
        """Refuse new jobs and answer the queued ones with ``ShuttingDownError``; let the
        running job finish for up to ``drain`` seconds (None: as long as it takes), then
        stop it with ``ShuttingDownError``; stop the worker, which saves the memory (if it
        has a path). True once the worker has stopped; False if it did not within
        ``timeout`` seconds after the drain (then the memory is not saved: logged)."""
        with self._submit_lock:
            first = not self._closed
            self._closed = True
            if first:
                self._refuse_queued()
                self._queue.put(None)
        self._worker.join(drain)
        if self._worker.is_alive():
            stop = ShuttingDownError(f"the server is shutting down: the request was stopped after {drain:g} s")
            t_end = None if timeout is None else time.monotonic() + timeout
            # the running job, whichever it is by now, stops at its next step
            while self._worker.is_alive() and (t_end is None or time.monotonic() < t_end):
                job = self.running
                if job is not None:
                    job.cancel(stop)
                self._worker.join(0.05)
        if self._worker.is_alive():
            log.error("the engine did not stop within %s s of the drain: the memory is not saved", timeout)
            return False
        return True

    def _refuse_queued(self) -> None:
        waiting = []
        while True:
            try:
                waiting.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for j in waiting:
            if j is not None:
                j.cancel()
                self._finish(j, error=ShuttingDownError("the server is shutting down"))

    def save_memory(self) -> bool:
        """Save the memory now, on the calling thread: call it only when no job runs
        (the worker does, between jobs)."""
        if self.memory is None or self.memory_path is None:
            return False
        learned = self.memory.learned
        self.memory.save(self.memory_path, self.backend.n_vocab, self.fingerprint())
        self.saves += 1
        self._last_save = time.monotonic()
        self._learned_at_save = learned
        return True

    def make_drafter(self, name: str, n_draft: int, options: dict | None = None, gate=None):
        """The drafter ``name`` as a job gets it: the engine's options when ``name`` is its
        default drafter, then ``options`` (a request's own), the shared state its registry
        spec takes (the memory's, the static table), and the adaptive gate on this model's
        costs (``ngramcache.decoding.gate.gated_drafter``): ``gate``, the one of the
        conversation the job continues, else a new one."""
        from ngramcache.decoding.gate import gated_drafter
        from ngramcache.drafters import registry

        opts = dict(self.drafter_opts) if name == self.drafter else {}
        opts.update(options or {})
        shared = self.memory.shared_state() if self.memory is not None else {}
        if self.static is not None:
            shared[registry.STATIC] = self.static
        return gated_drafter(self.costs, name, n_draft, gate=gate,
                             **opts, **registry.spec(name).shared_kwargs(shared))

    _make_drafter = make_drafter  # the name the command line's engine builder calls

    def snapshot(self) -> tuple[dict, dict]:
        """(counters, seconds) so far, copied."""
        return self.tally.snapshot()

    # -- the worker ---------------------------------------------------------------------

    def _saving(self) -> bool:
        return bool(self.save_every) and self.memory is not None and self.memory_path is not None

    def _work(self) -> None:
        while True:
            timeout = None
            if self._saving():
                timeout = max(0.05, self.save_every - (time.monotonic() - self._last_save))
            try:
                job = self._queue.get(timeout=timeout)
            except queue.Empty:
                job = False
            if job is None:
                break
            if job is not False:
                self._run(job)
            # an idle server does not rewrite an unchanged memory every interval
            if (self._saving() and time.monotonic() - self._last_save >= self.save_every
                    and self.memory.learned != self._learned_at_save):
                self._save_quietly()
        if self.memory is not None and self.memory_path is not None:
            self._save_quietly()

    def _save_quietly(self) -> None:
        try:
            self.save_memory()
            self.last_save_error = None
        except Exception as e:  # a full disk must not stop the worker; the old file is intact
            self.last_save_error = str(e) if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
            self.save_errors.append(self.last_save_error)
            self._last_save = time.monotonic()
            log.error("memory not saved to %s: %s", self.memory_path, self.last_save_error)

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
            self.tally.count(cancelled=1)
            self._finish(job, error=job.cancel_error or CancelledError("cancelled before it started"))
            return
        self.running = job
        try:
            plan = job.plan if job.plan is not None else resolve_speculative(job.speculative, self.drafter,
                                                                             self.n_draft)
            name = plan.drafter
            drafter = gate_key = None
            if name is not None:
                gate_key = (name, plan.n_draft, tuple(sorted((plan.options or {}).items())))
                drafter = self.make_drafter(name, plan.n_draft, plan.options,
                                            gate=self.conversations.find(job.prompt, gate_key))
            stops = StopFilter(job.stop)
            sink = TextSink(self.backend)
            emit = job.on_text

            def on_tokens(tokens, n_from_draft):
                for text, drafted in zip(sink.split(tokens, n_from_draft), (True, False)):
                    text = stops.feed(text)
                    if text and emit is not None:
                        emit(text, drafted)
                    if stops.stopped:
                        return True
                return job.cancelled.is_set()

            res = generate(self.backend, job.prompt, drafter, job.max_tokens, temperature=job.temperature,
                           seed=job.seed, top_k=job.top_k, top_p=job.top_p, on_tokens=on_tokens,
                           prompt_cache=self.prompt_cache if job.cache_prompt else None,
                           should_stop=job.cancelled.is_set)
            if not job.cache_prompt:
                self.prompt_cache.clear()  # the KV cache now holds this request, untracked
            if job.cancel_error is not None:
                self.tally.count(cancelled=1)
                self._finish(job, error=job.cancel_error)
                return
            tail = stops.feed(sink.flush()) + stops.flush()
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
                               t_verify=res.t_verify, t_total=res.t_total, t_queue=t_queue,
                               why_no_drafts=why_no_drafts(drafter) if res.steps and not res.drafted else None)
            if getattr(drafter, "gate", None) is not None and reason != "cancelled":
                self.conversations.keep(np.concatenate([job.prompt, res.tokens]), gate_key, drafter.gate)
            if self.memory is not None and job.learn and reason != "cancelled":
                self.memory.learn(np.concatenate([job.prompt, res.tokens]), mod_learned=_drafts_into_mod_table(name))
            self.tally.count(result=result)
            self._finish(job, result=result)
        except BaseException as e:  # the job's error, never the worker's end
            self.prompt_cache.clear()
            self.tally.count(failed=1)
            self._finish(job, error=e)
        finally:
            self.running = None


def _longest_piece(llm, backend) -> int:
    """The longest text one token of the vocabulary stands for, in bytes (0: unknown).
    A llama.cpp model's special tokens count as their written form, which the tokenizer
    parses into one token."""
    n_vocab = getattr(backend, "n_vocab", 0)
    if llm is not None:
        import ctypes

        import llama_cpp

        vocab = llm._model.vocab
        buf = ctypes.create_string_buffer(512)
        # the special text too: "<|im_start|>" in a prompt is one token; a piece longer
        # than the buffer is told as its length, negated
        return max((abs(llama_cpp.llama_token_to_piece(vocab, t, buf, 512, 0, True)) for t in range(n_vocab)),
                   default=0)
    piece = getattr(backend, "piece", None)
    if piece is None or not n_vocab:
        return 0
    return max((len(piece(t)) for t in range(n_vocab)), default=0)


def _drafts_into_mod_table(name: str | None) -> bool:
    # a drafter that writes the ngram-mod table learns the request into it as it drafts
    from ngramcache.drafters import registry

    if name is None:
        return False
    return any(s.kind == registry.MOD_TABLE and s.writes for s in registry.spec(name).shared_state)
