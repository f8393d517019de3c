"""Batched matrix products whose rows equal one-token rows, for llama.cpp's CPU backend.

On the exact build, llama.cpp verifies a draft of k tokens with its one-token dot product,
k times over, decoding every weight block again for each token. ngramcache's compiled
``_exact_matmul`` module registers a ggml accelerator backend that takes the products of
Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K and IQ4_XS weights, decodes each
weight block once for up to four tokens, and sums every token through exactly the operations of ggml's one-token kernel,
in the same order: each row of a batch is bit for bit the row one token gets
(docs/exactness.md, "Batched products in ngramcache's own kernels").

ggml's scheduler offers each product to the registered backends before the CPU backend, so
once registered (once per process, before a context is created) the backend serves every
``Llama`` of this process. Every other operation stays with ggml's CPU backend. Single tokens
come here too: their sums are ggml's bit for bit, computed faster.
``NGRAMCACHE_EXACT_MATMUL=0`` in the environment keeps it out.
"""

from __future__ import annotations

import ctypes
import os
import threading

ENV = "NGRAMCACHE_EXACT_MATMUL"
# The ggml whose backend interface the module declares: llama-cpp-python's vendored copy.
LLAMA_CPP_VERSION = "0.3.36"

# How ``configuration()`` and ``check-exact`` name it
DESCRIPTION = ("batched products of Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K and IQ4_XS "
               "weights in ngramcache's exact kernels")

_lock = threading.Lock()
_state: str | None = None

# ggml's numbering (ggml.h): checked against ggml itself before registering
_TYPE_Q8_0, _OP_MUL_MAT = 8, 29


def _libraries():
    """ggml's three libraries as llama-cpp-python's libllama loaded them. The wheel ships
    copies, not links, under several names: opening another name would load a second ggml
    with a registry of its own, so each is looked up by the name libllama asks for, among
    the libraries already loaded (``RTLD_NOLOAD``)."""
    import llama_cpp.llama_cpp  # noqa: F401  (loads libllama and, through it, ggml)

    def lib(soname: str):
        try:
            return ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError as exc:
            raise OSError(f"{soname} is not loaded by llama-cpp-python's libllama") from exc

    return lib("libggml-base.so.0"), lib("libggml.so.0"), lib("libggml-cpu.so.0")


def _layout_matches(module, base) -> bool:
    """Make two tensors and their product in a ggml context and read them back through the
    module's declaration of ``struct ggml_tensor``: the layout is what ggml uses."""

    class InitParams(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]

    base.ggml_init.restype = ctypes.c_void_p
    base.ggml_init.argtypes = [InitParams]
    base.ggml_free.argtypes = [ctypes.c_void_p]
    base.ggml_new_tensor_2d.restype = ctypes.c_void_p
    base.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_mul_mat.restype = ctypes.c_void_p
    base.ggml_mul_mat.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    base.ggml_set_name.restype = ctypes.c_void_p
    base.ggml_set_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    ctx = base.ggml_init(InitParams(1 << 16, None, True))
    if not ctx:
        return False
    try:
        w = base.ggml_new_tensor_2d(ctx, _TYPE_Q8_0, 64, 3)
        x = base.ggml_new_tensor_2d(ctx, 0, 64, 5)
        y = base.ggml_mul_mat(ctx, w, x)
        base.ggml_set_name(w, b"probe-w")
        base.ggml_set_name(y, b"probe-y")
        return (module.probe_layout(w, _TYPE_Q8_0, 64, 3, "probe-w", 0, 0, 0)
                and module.probe_layout(y, 0, 3, 5, "probe-y", _OP_MUL_MAT, w, x))
    finally:
        base.ggml_free(ctx)


def install(n_threads: int) -> str:
    """Register the backend in this process if it can serve this llama-cpp-python, and say
    what happened: ``"on"``, ``"off"`` (``NGRAMCACHE_EXACT_MATMUL=0``), or why not
    (``"unavailable: ..."``). Later calls only set its thread count."""
    global _state
    with _lock:
        if _state is not None:
            if _state == "on":
                from ngramcache import _exact_matmul

                _exact_matmul.register_backend({}, max(1, int(n_threads)))
            return _state
        _state = _install(max(1, int(n_threads)))
        return _state


def state() -> str | None:
    """What :func:`install` answered in this process, or None before it was called."""
    return _state


def products_by() -> str:
    """Who computes the weight products in this process: ``"ngramcache"`` or ``"ggml"`` (a
    part of every stored cost and exactness answer: they change with it)."""
    return "ngramcache" if _state == "on" else "ggml"


def _install(n_threads: int) -> str:
    if os.environ.get(ENV, "1").strip() == "0":
        return "off"
    try:
        from ngramcache import _exact_matmul
    except ImportError as exc:  # an ngramcache built without the module
        return f"unavailable: {exc}"
    import llama_cpp

    if llama_cpp.__version__ != LLAMA_CPP_VERSION:
        return f"unavailable: made for llama-cpp-python {LLAMA_CPP_VERSION}, found {llama_cpp.__version__}"
    if not _exact_matmul.cpu_supported():
        return "unavailable: the CPU lacks AVX2, FMA or F16C"
    try:
        base, ggml, cpu = _libraries()
    except OSError as exc:
        return f"unavailable: {exc}"
    base.ggml_op_name.restype = ctypes.c_char_p
    base.ggml_op_name.argtypes = [ctypes.c_int]
    base.ggml_type_name.restype = ctypes.c_char_p
    base.ggml_type_name.argtypes = [ctypes.c_int]
    if base.ggml_op_name(_OP_MUL_MAT) != b"MUL_MAT" or base.ggml_type_name(_TYPE_Q8_0) != b"q8_0":
        return "unavailable: ggml's numbering of operations or types differs"
    if not _layout_matches(_exact_matmul, base):
        return "unavailable: ggml's tensor layout differs"

    try:  # ggml's threads: the OpenMP runtime its CPU backend was linked with
        gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return "unavailable: llama-cpp-python's ggml does not run its threads with libgomp"

    def addr(lib, name: str) -> int:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0

    addresses = {
        "ggml_backend_register": addr(ggml, "ggml_backend_register"),
        "ggml_backend_cpu_buffer_type": addr(base, "ggml_backend_cpu_buffer_type"),
        "ggml_backend_buft_is_host": addr(base, "ggml_backend_buft_is_host"),
        "ggml_graph_n_nodes": addr(base, "ggml_graph_n_nodes"),
        "ggml_graph_node": addr(base, "ggml_graph_node"),
        "ggml_get_type_traits_cpu": addr(cpu, "ggml_get_type_traits_cpu"),
        "GOMP_parallel": addr(gomp, "GOMP_parallel"),
        "omp_get_thread_num": addr(gomp, "omp_get_thread_num"),
        "omp_get_num_threads": addr(gomp, "omp_get_num_threads"),
    }
    _exact_matmul.register_backend(addresses, n_threads)
    return "on"
