"""Whether llama.cpp gives a model the same logits for a token decoded alone and in a batch.

Speculative decoding verifies drafted tokens in one batched forward pass, so its greedy output
equals plain one-token-at-a-time decoding exactly when every logits row of a batch is bitwise
the row of a single-token decode. llama.cpp's CPU backend guarantees that only when none of
its batch-size-dependent kernels runs (docs/exactness.md):

* the llamafile sgemm kernels: a build option, ``-DGGML_LLAMAFILE=OFF`` when llama-cpp-python
  is compiled (``build_info()["llamafile"]`` tells whether it was);
* weight repacking (``llama_model_params.use_extra_bufts``): switched off for every model
  ngramcache loads (:func:`no_weight_repacking`);
* the tiled K-quant matmul taken at 8 or more rows: environment variable
  ``GGML_CPU_TILED_MM=0``, which ggml reads once per process, at its first matrix product
  (:func:`exact_kernels`, called before every model ngramcache loads).

:func:`check_exact` measures it for a loaded model (decodes a fixed prompt both ways and
compares the rows) and keeps the answer on disk per model file, build, threads and settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import sys
import threading
import time
import warnings
from importlib import resources

import numpy as np

__all__ = ["ExactnessReport", "ExactnessWarning", "check_exact", "measure_exactness", "exactness_status",
           "exact_kernels", "no_weight_repacking", "weight_repacking", "warn_flash_attention",
           "warn_no_exact_configuration", "known_causes", "build_info", "exactness_store_path", "configuration",
           "TILED_MM_ENV"]

#: ggml's switch for its tiled K-quant matrix product (a batch of >= 8 rows takes another
#: summation order than a single row)
TILED_MM_ENV = "GGML_CPU_TILED_MM"

#: rows compared by the check: tokens greedily decoded one at a time after the prompt
CHECK_TOKENS = 48
#: the check's batch size: the tiled path starts at 8 rows, and ngramcache verifies 2-17
CHECK_CHUNK = 8
_STORE_VERSION = "v1"

_tiled_state: str | None = None  # "off", "on" or "unsure", once decided for this process
_tiled_lock = threading.Lock()
# held while a model loads with the replaced defaults; reentrant, so that a block may nest
_repack_lock = threading.RLock()


class ExactnessWarning(UserWarning):
    """ngramcache could not make llama.cpp's kernels batch-size independent."""


def _any_model_loaded_before() -> bool:
    if "llama_cpp" not in sys.modules:
        return False  # no llama.cpp model can have run a matrix product yet
    llama_cpp = sys.modules["llama_cpp"]
    llama_cls = getattr(llama_cpp, "Llama", None)
    flag = getattr(llama_cls, "_Llama__backend_initialized", None)
    if isinstance(flag, bool):
        return flag  # set by the first Llama ever constructed in this process
    internals = sys.modules.get("llama_cpp._internals")
    ctx_cls = getattr(internals, "LlamaContext", None)
    return ctx_cls is not None and any(isinstance(o, ctx_cls) for o in gc.get_objects())


def _atoi(text: str) -> int:
    """C's atoi, which is how ggml reads the switch: leading blanks, a sign, then digits as
    far as they go ("1x" is 1, "x" is 0)."""
    s = text.lstrip(" \t\n\v\f\r")
    sign = -1 if s[:1] == "-" else 1
    s = s[1:] if s[:1] in "+-" and s else s
    digits = len(s) - len(s.lstrip("0123456789"))
    return sign * int(s[:digits]) if digits else 0


def exact_kernels() -> str:
    """Switch off ggml's tiled K-quant matmul for this process (``GGML_CPU_TILED_MM=0``)
    unless the environment already sets it, and say whether it is in force: ``"off"`` (it
    is), ``"on"`` (the environment asks for it: respected) or ``"unsure"`` (set here after a
    model of llama-cpp-python was already loaded in this process; ggml reads it once, at its
    first matrix product, so it may come too late: an ``ExactnessWarning`` says so once).
    Call it before creating a ``Llama`` yourself; ``make_llama`` does."""
    global _tiled_state
    with _tiled_lock:
        if _tiled_state is not None:
            return _tiled_state
        value = os.environ.get(TILED_MM_ENV)
        if value is not None:
            _tiled_state = "off" if _atoi(value) == 0 else "on"
            return _tiled_state
        late = _any_model_loaded_before()
        os.environ[TILED_MM_ENV] = "0"
        _tiled_state = "unsure" if late else "off"
    if late:
        warnings.warn(
            f"{TILED_MM_ENV}=0 was set after a llama-cpp-python model was loaded in this process; llama.cpp "
            "reads it once, at its first matrix product, so batched and single-token logits may still differ. "
            f"Set {TILED_MM_ENV}=0 in the environment before starting Python, or create models with "
            "ngramcache.llama.make_llama first", ExactnessWarning, stacklevel=2)
    return _tiled_state


def _tiled_now() -> str:
    """The tiled matmul's state as :func:`exact_kernels` reports it, without switching it off:
    a process that chose llama-cpp-python's own kernels (``NGRAMCACHE_EXACT=0``) is measured
    and reported as it runs."""
    if _tiled_state is not None:
        return _tiled_state
    value = os.environ.get(TILED_MM_ENV)
    return "off" if value is not None and _atoi(value) == 0 else "on"


_no_exact_said = False


def warn_no_exact_configuration() -> None:
    """Say, once per process, that this llama.cpp build has no exact configuration: its
    llamafile kernels are compiled in and take batches another way than one token whatever
    the loading settings (docs/exactness.md has what leaving them out costs per type)."""
    global _no_exact_said
    if _no_exact_said:
        return
    _no_exact_said = True
    warnings.warn(
        "this llama-cpp-python was built with llamafile's kernels: no loading setting makes a batch's logits equal "
        "one token's on it, so drafting can change greedy output after a near tie; rebuild it with "
        "CMAKE_ARGS=-DGGML_LLAMAFILE=OFF and pip's --no-cache-dir (docs/exactness.md: what that costs per "
        "quantization type)", ExactnessWarning, stacklevel=3)


def warn_flash_attention() -> None:
    """Say that flash attention makes batched logits differ from single-token ones: ggml's
    flash-attention node gives a token other values in a batch than alone (measured on both
    packaged models, docs/exactness.md)."""
    warnings.warn("flash attention is on: ggml's flash-attention kernel gives a token other values in a batch than "
                  "alone, so drafting can change greedy output after a near tie; create the Llama with "
                  "flash_attn=False for exact output", ExactnessWarning, stacklevel=3)


@contextlib.contextmanager
def no_weight_repacking():
    """Within this block, every ``llama_cpp.Llama`` created loads its weights as stored
    (``llama_model_params.use_extra_bufts = False``): the CPU backend otherwise repacks
    quantized weights into interleaved layouts whose kernels sum in another order for a
    batch than for one row. llama-cpp-python 0.3.36 has no argument for it and fills its
    model parameters from ``llama_model_default_params()`` inside ``Llama.__init__``, so
    that function is what this block replaces (for all threads, hence the lock)::

        with ngramcache.llama.no_weight_repacking():
            llm = Llama(model_path, ...)
    """
    import llama_cpp.llama_cpp as low

    with _repack_lock:
        default = low.llama_model_default_params

        def unrepacked():
            params = default()
            params.use_extra_bufts = False
            return params

        low.llama_model_default_params = unrepacked
        try:
            yield
        finally:
            low.llama_model_default_params = default


def weight_repacking(llm) -> bool:
    """Whether ``llm`` (a ``llama_cpp.Llama``) was loaded with weight repacking allowed."""
    params = getattr(llm, "model_params", None)
    return bool(getattr(params, "use_extra_bufts", True))


def build_info() -> dict:
    """The llama.cpp build behind llama-cpp-python: its version, ggml's CPU feature line,
    whether the llamafile kernels are compiled in, and a fingerprint of the shared
    libraries (a rebuild with other options changes it)."""
    import llama_cpp

    system = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()
    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    try:
        libs = sorted(n for n in os.listdir(lib) if ".so" in n or n.endswith((".dylib", ".dll")))
        stats = [(n, os.stat(os.path.join(lib, n))) for n in libs]
        fingerprint = ";".join(f"{n}:{st.st_size}:{st.st_mtime_ns}" for n, st in stats if not os.path.islink(
            os.path.join(lib, n)))
    except OSError:
        fingerprint = "unknown"
    return {"llama_cpp_python": llama_cpp.__version__, "system_info": system,
            "llamafile": "LLAMAFILE = 1" in system, "libraries": fingerprint}


def configuration(llm) -> str:
    """In words, how ``llm`` decodes: the kernels of its one-token steps and verified drafts,
    and those of its prompts (a worker process on your own llama-cpp-python build, or a
    repacked copy, where ``make_llama`` started one: ``ngramcache.integrations.llama_prompt_worker``,
    ``ngramcache.integrations.llama_prompt``)."""
    tiled = _tiled_now()
    kernels = ", ".join([
        "llamafile kernels compiled in" if build_info()["llamafile"] else "no llamafile kernels",
        "weights repacked" if weight_repacking(llm) else "weights as stored (no repacking)",
        "tiled matmul " + {"off": "off", "on": "on", "unsure": "maybe on"}[tiled]])
    from ngramcache.integrations import llama_exact_matmul

    matmul = llama_exact_matmul.state()
    if matmul == "on":
        kernels += ", " + llama_exact_matmul.DESCRIPTION
    elif matmul is not None:  # said, so that a user sees why verification costs more
        kernels += f", weight products in ggml's one-token kernel (ngramcache's: {matmul})"
    layout = getattr(llm, "_ngramcache_prompt_layout", None)
    if layout is None:
        prompts = "prompts through the same kernels"
    elif hasattr(layout, "folder"):  # a PromptWorker
        prompts = (f"prompts through your llama-cpp-python build in {layout.folder} in a worker process "
                   f"(+{layout.memory_bytes / 2**20:.0f} MiB), their KV cache handed over")
    else:
        prompts = (f"prompts through a repacked copy of the weights (+{layout.memory_bytes / 2**20:.0f} MiB), "
                   "their KV cache handed over")
    return f"tokens and drafts: {kernels}; {prompts}"


def known_causes(*, llamafile: bool, weight_repacking: bool, tiled_mm: str, flash_attn: bool) -> list[str]:
    """The batch-size-dependent paths these settings leave on, each with its remedy."""
    out = []
    if llamafile:
        out.append("llama.cpp was built with its llamafile kernels (rebuild llama-cpp-python with "
                   "CMAKE_ARGS=-DGGML_LLAMAFILE=OFF and pip's --no-cache-dir)")
    if weight_repacking:
        out.append("the model was loaded with weight repacking (load it with make_llama, or inside "
                   "ngramcache.llama.no_weight_repacking())")
    if tiled_mm != "off":
        out.append(f"ggml's tiled matmul may be on ({TILED_MM_ENV} {tiled_mm}; set {TILED_MM_ENV}=0 "
                   "before the first model is loaded)")
    if flash_attn:
        out.append("flash attention is on (create the Llama with flash_attn=False)")
    return out


@dataclasses.dataclass(frozen=True)
class ExactnessReport:
    """One model's batched logits against its single-token logits.

    ``rows``: logits rows compared (tokens greedily decoded one at a time after a fixed
    prompt, then the same tokens decoded again in batches of ``chunk``); ``rows_equal``:
    rows bitwise equal; ``max_abs_diff``: the largest difference of one logit;
    ``first_argmax_flip``: the first row whose top token differs (None: none does);
    ``exact``: every row equal. The settings it was measured under follow, and ``causes``
    lists the known batch-size-dependent paths that were on."""

    model: str
    rows: int
    rows_equal: int
    max_abs_diff: float
    first_argmax_flip: int | None
    chunk: int
    n_threads: int
    n_threads_batch: int
    weight_repacking: bool
    tiled_mm: str
    llamafile: bool
    flash_attn: bool
    seconds: float
    cached: bool = False

    @property
    def exact(self) -> bool:
        return self.rows > 0 and self.rows_equal == self.rows

    @property
    def verdict(self) -> str:
        return "exact" if self.exact else "not exact"

    @property
    def causes(self) -> list[str]:
        return known_causes(llamafile=self.llamafile, weight_repacking=self.weight_repacking,
                            tiled_mm=self.tiled_mm, flash_attn=self.flash_attn)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(exact=self.exact, verdict=self.verdict, causes=self.causes)
        return d


def check_prompt() -> str:
    """The check's fixed prompt (about 600 tokens of prose and a question), shipped with
    the package so that every machine measures the same thing."""
    return resources.files("ngramcache").joinpath("data/exact_check.txt").read_text(encoding="utf-8")


def _settings(llm) -> dict:
    import llama_cpp

    ctx = llm._ctx.ctx
    cp = llm.context_params
    return {"n_threads": int(llama_cpp.llama_n_threads(ctx)),
            "n_threads_batch": int(llama_cpp.llama_n_threads_batch(ctx)), "weight_repacking": weight_repacking(llm),
            "flash_attn": int(cp.flash_attn_type) == int(llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED)}


def measure_exactness(llm, prompt=None, n_tokens: int = CHECK_TOKENS, chunk: int = CHECK_CHUNK) -> ExactnessReport:
    """Decode ``n_tokens`` greedily one at a time after ``prompt`` (default: the shipped
    check prompt), decode the same tokens again in batches of ``chunk`` after the same
    prompt, and compare the logits rows. Clears ``llm``'s KV cache. A few seconds for the
    packaged models."""
    from ngramcache._validate import check_int
    from ngramcache.integrations.llama_backend import LlamaBackend

    n_tokens = check_int("n_tokens", n_tokens, 1)
    chunk = check_int("chunk", chunk, 1)
    t0 = time.perf_counter()
    tiled = _tiled_now()
    m = LlamaBackend.of(llm)
    chunk = min(chunk, m.n_batch)
    toks = m.tokenize(check_prompt() if prompt is None else prompt)
    room = m.n_ctx - n_tokens - 1
    if room < 2:
        raise ValueError(f"n_ctx {m.n_ctx} leaves no room for a prompt before {n_tokens} tokens")
    if toks.size > room:  # keep the first token (BOS) and the end of the prompt
        toks = np.concatenate([toks[:1], toks[toks.size - room + 1:]])
    n_prompt = int(toks.size)

    def prefill() -> np.ndarray:
        m.clear()
        for s in range(0, n_prompt, m.n_batch):
            part = toks[s : s + m.n_batch]
            m.decode(part, s, len(part) - 1 if s + len(part) == n_prompt else len(part))
        return m.logits(len(part) - 1)

    try:
        generated = [int(np.argmax(prefill()))]
        single = np.empty((n_tokens, m.n_vocab), dtype=np.float32)
        for i in range(n_tokens):
            m.decode(generated[i : i + 1], n_prompt + i, 0)
            single[i] = m.logits(0)
            generated.append(int(np.argmax(single[i])))
        if m.can_keep(n_prompt):  # the prompt's KV entries are the same: no second prefill
            m.truncate(n_prompt)
        else:
            prefill()
        batched = np.empty_like(single)
        for s in range(0, n_tokens, chunk):
            part = generated[s : min(s + chunk, n_tokens)]
            m.decode(part, n_prompt + s, 0)
            for j in range(len(part)):
                batched[s + j] = m.logits(j)
    finally:
        m.clear()
    same = (single.view(np.uint32) == batched.view(np.uint32)).all(axis=1)
    flips = np.nonzero(single.argmax(axis=1) != batched.argmax(axis=1))[0]
    with np.errstate(invalid="ignore"):
        diff = float(np.nanmax(np.abs(single - batched)))
    s = _settings(llm)
    return ExactnessReport(model=str(llm.model_path), rows=n_tokens, rows_equal=int(same.sum()),
                           max_abs_diff=diff, first_argmax_flip=int(flips[0]) if flips.size else None, chunk=chunk,
                           n_threads=s["n_threads"], n_threads_batch=s["n_threads_batch"],
                           weight_repacking=s["weight_repacking"], tiled_mm=tiled,
                           llamafile=build_info()["llamafile"], flash_attn=s["flash_attn"],
                           seconds=round(time.perf_counter() - t0, 3))


# ---------------------------------------------------------------------------------
# The answers, kept on disk beside the verification costs


def exactness_store_path() -> str:
    """``exactness.json`` in the folder of ``cost_store_path()`` ($NGRAMCACHE_CACHE_DIR,
    else ``ngramcache`` under $XDG_CACHE_HOME or ~/.cache)."""
    from ngramcache.decoding.costs import cost_store_path

    return os.path.join(os.path.dirname(cost_store_path()), "exactness.json")


def _store_key(llm, tiled: str) -> str:
    path = os.path.abspath(llm.model_path)
    st = os.stat(path)
    s = _settings(llm)
    b = build_info()
    cp = llm.context_params
    return "|".join([_STORE_VERSION, path, str(st.st_size), str(st.st_mtime_ns), b["llama_cpp_python"], b["libraries"],
                     f"t{s['n_threads']}", f"tb{s['n_threads_batch']}", f"repack{int(s['weight_repacking'])}",
                     f"tiled-{tiled}", f"fa{int(s['flash_attn'])}", f"k{cp.type_k}v{cp.type_v}",
                     f"matmul-{_matmul_by()}"])


def _matmul_by() -> str:
    from ngramcache.integrations import llama_exact_matmul

    return llama_exact_matmul.products_by()


def _read_store(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError, RecursionError):
        return {}
    return table if isinstance(table, dict) else {}


_FIELDS = {f.name for f in dataclasses.fields(ExactnessReport)} - {"cached"}


def _from_stored(entry) -> ExactnessReport | None:
    if not isinstance(entry, dict) or set(entry) != _FIELDS:
        return None
    try:
        report = ExactnessReport(**entry, cached=True)
    except TypeError:
        return None
    counts = (report.rows, report.rows_equal, report.chunk, report.n_threads, report.n_threads_batch)
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in counts) \
            or not 0 <= report.rows_equal <= report.rows:
        return None
    return report


def _stored(llm, tiled: str, path: str) -> ExactnessReport | None:
    return _from_stored(_read_store(path).get(_store_key(llm, tiled)))


def _causes(llm, tiled: str) -> list[str]:
    s = _settings(llm)
    return known_causes(llamafile=build_info()["llamafile"], weight_repacking=s["weight_repacking"], tiled_mm=tiled,
                        flash_attn=s["flash_attn"])


def _is_llama(llm) -> bool:
    llama_cls = getattr(sys.modules.get("llama_cpp"), "Llama", None)
    return isinstance(llama_cls, type) and isinstance(llm, llama_cls)


def exactness_status(llm, measure: bool = False, path: str | None = None) -> dict | None:
    """What a server or a report says about ``llm`` in one call: ``{"exact", "measured",
    "rows_equal", "rows", "causes"}``. The stored measurement when there is one (see
    :func:`check_exact`); else, with ``measure``, a new one (seconds; clears the KV cache,
    so only while nothing else uses ``llm``); else a prediction from the settings that
    runs nothing: ``exact`` False when a batch-dependent path is on, None (unknown, none
    known to be on) otherwise. None for anything but a ``llama_cpp.Llama``."""
    if not _is_llama(llm):
        return None
    tiled = _tiled_now()
    path = path or exactness_store_path()
    report = check_exact(llm, path=path) if measure else _stored(llm, tiled, path)
    if report is not None:
        return {"exact": report.exact, "measured": True, "rows_equal": report.rows_equal, "rows": report.rows,
                "causes": report.causes}
    causes = _causes(llm, tiled)
    return {"exact": False if causes else None, "measured": False, "rows_equal": None, "rows": None,
            "causes": causes}


def check_exact(llm, refresh: bool = False, path: str | None = None) -> ExactnessReport:
    """Whether ``llm`` (a ``llama_cpp.Llama``) computes batched logits bitwise equal to
    single-token ones (:func:`measure_exactness`), measured once per model file, llama.cpp
    build, thread counts and settings, and kept in :func:`exactness_store_path` (a damaged
    store is replaced; an unwritable one only costs a new measurement next time). Not kept
    while the tiled-matmul switch is ``"unsure"``. Measuring clears ``llm``'s KV cache."""
    if not _is_llama(llm):
        raise TypeError(f"llm must be a llama_cpp.Llama, got {type(llm).__name__}")
    tiled = _tiled_now()
    path = path or exactness_store_path()
    if not refresh:
        report = _stored(llm, tiled, path)
        if report is not None:
            return report
    report = measure_exactness(llm)
    if tiled == "unsure":
        return report
    entry = dataclasses.asdict(report)
    del entry["cached"]
    try:
        from ngramcache.files import atomic_open

        os.makedirs(os.path.dirname(path), exist_ok=True)
        table = _read_store(path)
        table[_store_key(llm, tiled)] = entry
        with atomic_open(path, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=1, sort_keys=True)
    except OSError:
        pass
    return report
