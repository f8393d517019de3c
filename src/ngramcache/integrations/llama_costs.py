"""What verifying a batch of k tokens costs a llama.cpp model, learnt while decoding and
kept (``ngramcache.decoding.costs``), and the adaptive drafter built on it.

The llama.cpp side is the model's size (for the prior curve), an explicit timing hook (a
decode of k tokens through the model's ``LlamaBackend``, see
``ngramcache.decoding.costs.backend_timer``) and the key the costs are kept under: the model file (path, size, time), the llama.cpp build (llama-cpp-python's
version and its libraries), the kernel switches that change speed (weight repacking,
``GGML_CPU_TILED_MM``) and the thread counts.
"""

from __future__ import annotations

import hashlib
import os
from typing import Sequence

from ngramcache._validate import check_int
from ngramcache.decoding import costs as _costs
from ngramcache.decoding.costs import CostKey, cost_store_path
from ngramcache.defaults import N_DRAFT
from ngramcache.drafters.base import Drafter
from ngramcache.integrations.llama_backend import backend_of, llama_cpp

__all__ = ["calibrate", "verify_costs", "learned_costs", "adaptive_drafter", "load_costs", "store_costs", "cost_store_path",
           "cost_key"]


def _build(weight_repacking: bool) -> str:
    if llama_cpp is None:
        return "no-llama-cpp"
    from ngramcache.integrations.exactness import TILED_MM_ENV, build_info

    info = build_info()
    libraries = hashlib.sha256(f"{info['libraries']}|{info['system_info']}".encode()).hexdigest()[:16]
    from ngramcache.integrations import llama_exact_matmul

    tiled = os.environ.get(TILED_MM_ENV, "default")
    matmul = llama_exact_matmul.products_by()  # ngramcache's own products change every cost
    return (f"llama-cpp-python {info['llama_cpp_python']}|lib {libraries}|repack {int(weight_repacking)}|tiled {tiled}"
            f"|matmul {matmul}")


def cost_key(model_path: str, n_threads: int, n_threads_batch: int, weight_repacking: bool = False) -> CostKey:
    """The store's key for a GGUF file run by this process's llama.cpp build with these
    thread counts (``weight_repacking``: whether the model was loaded with it; ``make_llama``
    loads without)."""
    st = os.stat(model_path)
    return CostKey(backend="llama.cpp", model=f"{os.path.abspath(model_path)}|{st.st_size}|{int(st.st_mtime)}",
                   build=_build(weight_repacking), threads=f"t{n_threads}|tb{n_threads_batch}")


def _cost_key(model_path: str, n_threads: int, n_threads_batch: int) -> str:
    return str(cost_key(model_path, n_threads, n_threads_batch))


def load_costs(model_path: str, n_threads: int, n_threads_batch: int, path: str | None = None,
               weight_repacking: bool = False) -> list[float] | None:
    """The verification costs stored for this model file (its path, size and time), this
    llama.cpp build and these thread counts, or None."""
    return _costs.read_costs(cost_key(model_path, n_threads, n_threads_batch, weight_repacking), path)


def store_costs(model_path: str, n_threads: int, n_threads_batch: int, costs: Sequence[float],
                path: str | None = None, weight_repacking: bool = False) -> None:
    """Remember verification costs (atomically: temp file, fsync, rename); a damaged
    store is replaced."""
    _costs.write_costs(cost_key(model_path, n_threads, n_threads_batch, weight_repacking), costs, path)


def _measure(llm, max_batch: int, repeats: int = 5, n_context: int = 512, progress: bool = True):
    m = backend_of(llm)
    with _costs.backend_timer(m, max_batch, n_context) as time_batch:
        return _costs.calibrate(time_batch, max_batch, repeats, progress=progress)


def calibrate(llm, max_batch: int = 9, repeats: int = 5, n_context: int = 512) -> list[float]:
    """Seconds to verify batches of 1..``max_batch`` tokens (a decode with logits for
    every token plus the choice of a token from each row) after ``n_context`` tokens of
    context, on a ``llama_cpp.Llama`` or any ``Backend``: ``ngramcache.decoding.costs.calibrate``
    (interleaved rounds, medians, more rounds while noisy, a non-decreasing curve). The
    KV cache is cleared."""
    return _measure(llm, max_batch, repeats, n_context).costs


def learned_costs(llm, max_batch: int = 9) -> _costs.LearnedCosts:
    """The verification cost curve of this model, build and thread setting, at once: the one
    this process learns into, else the stored one (in ~/.cache/ngramcache/verify-costs.json;
    override the folder with $NGRAMCACHE_CACHE_DIR, see :func:`cost_store_path`), else the
    package's prior for a model of this size; refined from the verification times while
    decoding and saved for the next process (``ngramcache.decoding.costs.learned_costs``).
    A ``Backend`` that is no ``llama_cpp.Llama`` gets a fresh curve, not kept."""
    max_batch = check_int("max_batch", max_batch, 1)
    key = n_params = None
    if llama_cpp is not None and isinstance(llm, llama_cpp.Llama):
        from ngramcache.integrations.exactness import weight_repacking

        nt = llama_cpp.llama_n_threads(llm._ctx.ctx)
        ntb = llama_cpp.llama_n_threads_batch(llm._ctx.ctx)
        key = cost_key(llm.model_path, nt, ntb, weight_repacking(llm))
        n_params = int(llama_cpp.llama_model_n_params(llm._model.model))
    return _costs.learned_costs(key, max_batch, n_params)


def verify_costs(llm, max_batch: int = 9, refresh: bool = False) -> list[float]:
    """The verification costs of batches of 1..``max_batch`` tokens as known now, relative to
    one token (:func:`learned_costs`; nothing is measured). ``refresh``: measure them now
    (``calibrate``, seconds) and keep the measurement as the stored curve."""
    costs = learned_costs(llm, max_batch)
    if refresh:
        costs.replace(_measure(llm, max_batch).costs)
    return list(costs.curve()[:max_batch])


def adaptive_drafter(llm, static=None, dynamic=None, n_draft: int = N_DRAFT, ngram_min: int | None = None,
                     ngram_max: int | None = None, refresh: bool = False, copy: bool = True,
                     drafter: str | None = None, **options) -> Drafter:
    """ngramcache's drafter for ``llm``, with draft lengths that follow this model's
    verification costs (``learned_costs``) and the acceptance seen so far (a
    ``ngramcache.decoding.gate.Gate``): ``ngramcache.decoding.gate.gated_drafter``.

    ``drafter``: a name of ``ngramcache.drafters.catalog.DRAFTERS`` (default
    ``catalog.DEFAULT_DRAFTER``; ``copy=False`` without a name: ``lookup``), built with
    ``options`` (its constructor's keywords); ``static``, ``dynamic``, ``ngram_min`` and
    ``ngram_max`` apply to ``lookup`` and ``copy``."""
    from ngramcache.drafters.catalog import DEFAULT_DRAFTER, drafter_class

    n_draft = check_int("n_draft", n_draft, 0)
    if drafter is None and not copy:
        drafter = "lookup"
    from ngramcache.decoding.gate import gated_drafter

    drafter_class(DEFAULT_DRAFTER if drafter is None else drafter)  # an unknown name fails first
    n_batch = backend_of(llm).n_batch
    costs = learned_costs(llm, max_batch=max(1, min(n_draft + 1, n_batch)))
    if refresh and n_draft > 0:
        costs.replace(_measure(llm, costs.size).costs)
    return gated_drafter(costs, drafter, n_draft, static=static, dynamic=dynamic, ngram_min=ngram_min,
                         ngram_max=ngram_max, **options)
