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
(``generate_llama_cpp``), the verification costs of a model (learnt while decoding and
kept on disk: ``learned_costs``, ``verify_costs``; measured on request: ``calibrate``) and
the drafter that uses them (``adaptive_drafter``).

This module loads models and gathers the rest under one name: the backend lives in
``llama_backend``, the draft-model adapter and llama-cpp-python's own loop in
``llama_draft_model``, the verification costs in ``llama_costs``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import ngramcache.decoding.loop as generation
import ngramcache.models as models
from ngramcache._validate import check_int
from ngramcache.decoding.loop import GenerationResult
from ngramcache.drafters.base import Drafter
from ngramcache.integrations import default_build, exactness, llama_exact_matmul, llama_prompt
from ngramcache.integrations.exactness import ExactnessReport, check_exact, exactness_status, no_weight_repacking
from ngramcache.integrations.llama_backend import LlamaBackend, backend_of, llama_cpp, need_llama
from ngramcache.integrations.llama_costs import (_cost_key, adaptive_drafter, calibrate, cost_store_path,  # noqa: F401
                                                 learned_costs, load_costs, store_costs, verify_costs)  # (_cost_key: fuzz/targets.py)
from ngramcache.integrations.llama_draft_model import (CountingDraftModel, LlamaDraftModel, LlamaDrafter,
                                                       check_llama, generate_llama_cpp)
from ngramcache.integrations.llama_prompt_worker import PromptWorker

__all__ = [
    "LlamaDrafter", "generate", "stream", "make_llama", "check_llama", "default_threads",
    "verify_costs", "learned_costs", "calibrate", "adaptive_drafter", "load_costs", "store_costs", "cost_store_path",
    "LlamaBackend", "CountingDraftModel", "generate_llama_cpp",
    "check_exact", "exactness_status", "ExactnessReport", "no_weight_repacking",
]

#: at most this many threads by default: more rarely help a small model
MAX_DEFAULT_THREADS = 8


def default_threads() -> int:
    """Threads for single tokens and batches alike: the usable CPUs, at most 8."""
    return min(models.usable_cpus(), MAX_DEFAULT_THREADS)


def make_llama(model_path=None, drafter=None, *, n_ctx: int = 4096, n_batch: int = 512,
               n_threads: int | None = None, n_threads_batch: int | None = None,
               verbose: bool = False, exact: bool | None = None, prompt_layout: bool | None = None,
               **kwargs) -> "llama_cpp.Llama":
    """A ``llama_cpp.Llama`` configured for speculative decoding.

    ``drafter``: a ``LlamaDraftModel`` (e.g. ``LlamaDrafter``) or any ``Drafter``
    (wrapped in ``LlamaDrafter``); None for a model used with ``generate`` or alone.
    ``model_path``: a GGUF file or a packaged model's name (see
    :func:`ngramcache.models.model_path`); None means ``ngramcache.models.DEFAULT_MODEL``.

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

    Exact kernels (``exact=True``; the default unless the environment variable
    ``NGRAMCACHE_EXACT`` is ``0``): the weights are loaded without repacking
    and ggml's tiled matmul is switched off for the process before the first model loads
    (``ngramcache.integrations.exactness``), so that a batch's logits equal single-token
    logits bit for bit and speculative output equals plain decoding (docs/exactness.md).
    Before the first context, ngramcache's own matrix products are registered with ggml for
    the process (``ngramcache.integrations.llama_exact_matmul``; x86-64 with AVX2): each
    token's sum is bit for bit what ggml's one-token kernel gives, but a batch decodes each
    weight block once, so verifying a draft costs far less; ``NGRAMCACHE_EXACT_MATMUL=0``
    leaves every product to ggml. ``exact=False`` loads with llama-cpp-python's own
    defaults (the costs are in docs/exactness.md), with output that can leave plain
    decoding's after a near tie.

    Prompt layout (``prompt_layout``; exact models without a drafter): prompts of at least
    ``MIN_PROMPT_TOKENS`` tokens may run through faster kernels that are not batch invariant,
    the exact context taking over their KV cache; plain and speculative decoding still give
    the same tokens (``==``). None (the default, unless the environment variable
    ``NGRAMCACHE_PROMPT_LAYOUT`` is ``0``) picks the fastest there is:

    - your own llama-cpp-python build (llamafile's kernels, built for this CPU), where
      ``default_build.default_build_dir()`` finds one (``$NGRAMCACHE_DEFAULT_BUILD``, else
      ``~/.cache/ngramcache/llama-default``), in a worker process loading the same model
      (``ngramcache.integrations.llama_prompt_worker``);
    - else a second, repacked copy of the weights in this process, when this CPU repacks at
      least half of the model's matrix weights (``llama_prompt.MIN_REPACKED_SHARE``;
      ``ngramcache.integrations.llama_prompt``).

    True takes the repacked copy whatever the types where no build of your own is found;
    False keeps prompts in the exact context. What it costs in memory:
    ``llm._ngramcache_prompt_layout.memory_bytes``.
    """
    need_llama()
    if exact is None:
        exact = os.environ.get("NGRAMCACHE_EXACT", "1").strip() != "0"
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
        if exactness.build_info()["llamafile"]:
            exactness.warn_no_exact_configuration()
        else:
            # before the context exists: llama.cpp lists ggml's backends when it creates one
            llama_exact_matmul.install(n_threads_batch)
        if kwargs.get("flash_attn"):
            exactness.warn_flash_attention()
    # llama.cpp prints a few lines while loading even with verbose=False
    with suppress_stdout_stderr(disable=verbose), \
            exactness.no_weight_repacking() if exact else contextlib.nullcontext():
        llm = llama_cpp.Llama(model_path=path, draft_model=drafter, n_ctx=n_ctx, n_batch=n_batch,
                              n_threads=n_threads, n_threads_batch=n_threads_batch, verbose=verbose,
                              **kwargs)
    if prompt_layout is None:
        prompt_layout = os.environ.get("NGRAMCACHE_PROMPT_LAYOUT", "").strip() != "0" and None
    if exact and drafter is None and prompt_layout is not False:
        worker = _prompt_worker(path, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                                n_threads_batch=n_threads_batch, llama_kwargs=kwargs)
        if worker is not None:
            llm._ngramcache_prompt_layout = worker
            return llm
        share = llama_prompt.repacked_share(path, exactness.build_info()["system_info"])
        if prompt_layout or share >= llama_prompt.MIN_REPACKED_SHARE:
            rss0 = llama_prompt.anonymous_bytes()
            with suppress_stdout_stderr(disable=verbose):
                twin = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                                       n_threads_batch=n_threads_batch, verbose=verbose, **kwargs)
            n_swa = int(llama_cpp.llama_model_n_swa(twin._model.model)) if twin.context_params.swa_full is False else 0
            llm._ngramcache_prompt_layout = llama_prompt.PromptLayout(twin, max(0, llama_prompt.anonymous_bytes() - rss0), n_swa)
    return llm


_worker_failure_said = False


def _prompt_worker(path, **config):
    """A :class:`~ngramcache.integrations.llama_prompt_worker.PromptWorker` on the user's own
    llama-cpp-python build where one is found (``default_build.default_build_dir()``), else
    None. A worker that fails to start is said once, and the prompts stay in this process."""
    global _worker_failure_said
    folder = default_build.default_build_dir()
    if folder is None:
        return None
    try:
        json.dumps(config["llama_kwargs"])
    except (TypeError, ValueError):  # arguments a child process cannot be given
        return None
    try:
        return PromptWorker.start(folder, path, **config)
    except RuntimeError as e:
        if not _worker_failure_said:
            _worker_failure_said = True
            print(f"ngramcache: {e}; prompts are decoded by the exact build", file=sys.stderr)
        return None


def generate(llm, prompt, drafter: Drafter | None = None, max_tokens: int = 128, **kw) -> GenerationResult:
    """:func:`ngramcache.decoding.loop.generate` on a ``llama_cpp.Llama`` (through its
    ``LlamaBackend``) or on any ``Backend``; the same keyword arguments."""
    return generation.generate(backend_of(llm), prompt, drafter, max_tokens, **kw)


def stream(llm, prompt, drafter: Drafter | None = None, max_tokens: int = 128, **kw) -> generation.Stream:
    """:class:`ngramcache.decoding.loop.Stream` on a ``llama_cpp.Llama`` or any ``Backend``:
    iterate over the text pieces, then read ``.result``."""
    return generation.Stream(backend_of(llm), prompt, drafter, max_tokens, **kw)
