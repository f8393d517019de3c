"""ngramcache's batched matrix products for llama.cpp (ngramcache.integrations.llama_exact_matmul):
every sum bit for bit what ggml's own one-token kernel gives, on random and extreme blocks,
for every batch width; and, registered with ggml, a model's batched rows equal to its
one-token rows while the backend computes them."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")
_exact_matmul = pytest.importorskip("ngramcache._exact_matmul")
from ngramcache.integrations import llama_exact_matmul  # noqa: E402

if not _exact_matmul.cpu_supported():
    pytest.skip("the CPU lacks AVX2, FMA or F16C", allow_module_level=True)

# ggml's type numbers and block sizes (bytes per 32 weights)
TYPES = {"q8_0": (8, 34), "q5_0": (6, 22), "q4_0": (2, 18)}


class _Traits(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


_FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


@pytest.fixture(scope="module")
def ggml_cpu():
    _, _, cpu = llama_exact_matmul._libraries()
    cpu.ggml_cpu_init()  # ggml's half-float tables, as a context's creation would fill them
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_Traits)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]

    def traits(type_id: int):
        t = cpu.ggml_get_type_traits_cpu(type_id).contents
        return _FROM_FLOAT(t.from_float), _VEC_DOT(t.vec_dot), t.vec_dot_type

    return traits


def _quantize(from_float, rows: np.ndarray, block: int) -> np.ndarray:
    k = rows.shape[1]
    out = np.zeros(rows.shape[0] * k // 32 * block, np.uint8)
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    for r in range(rows.shape[0]):
        from_float(rows[r].ctypes.data, out.ctypes.data + r * k // 32 * block, k)
    return out


def _ggml_sums(vec_dot, wq: np.ndarray, xq: np.ndarray, k: int, m: int, n: int, block: int) -> np.ndarray:
    ref = np.zeros((n, m), np.float32)
    s = ctypes.c_float()
    for c in range(n):
        for r in range(m):
            vec_dot(k, ctypes.byref(s), 0, wq.ctypes.data + r * k // 32 * block, 0,
                    xq.ctypes.data + c * k // 32 * 34, 0, 1)
            ref[c, r] = s.value
    return ref


def _cases(rng):
    """Weights and tokens: random with row scales spread over decades, constant rows (every
    quant at its extreme), zero blocks, alternating signs, one huge element per block."""
    yield "random", rng.standard_normal((13, 640)) * rng.uniform(1e-3, 30, (13, 1)), \
        rng.standard_normal((9, 640)) * rng.uniform(1e-2, 100, (9, 1))
    yield "extremes", np.tile([1.0, -1.0], (7, 1024)), np.tile([-3.0, 3.0], (5, 1024))
    w = rng.standard_normal((6, 96))
    w[:, 32:64] = 0.0
    x = rng.standard_normal((4, 96))
    x[1] = 0.0
    yield "zero blocks", w, x
    w = rng.standard_normal((5, 2048)) * 1e-3
    w[:, ::32] = 50.0
    yield "outliers", w, rng.standard_normal((17, 2048))


@pytest.mark.parametrize("name", sorted(TYPES))
def test_kernel_sums_equal_ggml_one_token_sums_bit_for_bit(ggml_cpu, name):
    type_id, block = TYPES[name]
    from_float_w, vec_dot, vec_dot_type = ggml_cpu(type_id)
    assert vec_dot_type == 8  # these types' one-token kernel reads tokens in Q8_0
    from_float_q8, _, _ = ggml_cpu(8)
    rng = np.random.default_rng(7)
    for label, w, x in _cases(rng):
        k, m, n = w.shape[1], w.shape[0], x.shape[0]
        wq = _quantize(from_float_w, w, block)
        xq = _quantize(from_float_q8, x, 34)
        ref = _ggml_sums(vec_dot, wq, xq, k, m, n, block)
        for width in range(1, n + 1):  # every batch width, so every tile shape and remainder
            got = np.frombuffer(_exact_matmul.dot_rows(type_id, wq, xq[: width * k // 32 * 34], k),
                                np.float32).reshape(width, m)
            assert np.array_equal(got.view(np.uint32), ref[:width].view(np.uint32)), (label, width)


def test_kernel_rejects_what_it_cannot_read():
    with pytest.raises(ValueError, match="type"):
        _exact_matmul.dot_rows(12, b"\0" * 144, b"\0" * 34 * 8, 256)  # Q4_K: not one of its types
    with pytest.raises(ValueError, match="multiple of 32"):
        _exact_matmul.dot_rows(8, b"\0" * 34, b"\0" * 34, 20)
    with pytest.raises(ValueError, match="whole rows"):
        _exact_matmul.dot_rows(8, b"\0" * 35, b"\0" * 34, 32)
    with pytest.raises(ValueError, match="at least 1"):
        _exact_matmul.register_backend({}, 0)


def _model_path(name: str) -> str:
    from ngramcache.models import default_model_path

    try:
        return default_model_path(name)
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_registered_backend_computes_batches_and_their_rows_equal_one_token_rows():
    import ngramcache.llama as nl
    from ngramcache.integrations import exactness

    if exactness.build_info()["llamafile"]:
        pytest.skip("this llama-cpp-python has the llamafile kernels: no exact configuration")
    llm = nl.make_llama(_model_path("gemma"), n_ctx=1024, prompt_layout=False)
    assert llama_exact_matmul.state() == "on"
    assert llama_exact_matmul.DESCRIPTION in exactness.configuration(llm)
    backend = nl.LlamaBackend.of(llm)
    toks = backend.tokenize("The harbour opens in April, and the pump is checked every spring by the keeper.")
    backend.clear()
    before = _exact_matmul.products()
    backend.decode(toks[:1], 0, 0)
    backend.decode(toks[1:2], 1, 0)
    assert _exact_matmul.products() == before  # single tokens stay with ggml's CPU backend
    backend.decode(toks[2:10], 2, 0)
    assert _exact_matmul.products() > before  # a batch's weight products come here
    before = _exact_matmul.products()
    report = exactness.measure_exactness(llm)
    assert _exact_matmul.products() > before
    assert report.rows == report.rows_equal == exactness.CHECK_TOKENS
    llm.close()


def test_environment_keeps_it_out():
    code = ("import ngramcache.llama as nl; from ngramcache.integrations import llama_exact_matmul as m, exactness; "
            "from ngramcache import _exact_matmul as e; llm = nl.make_llama(%r, n_ctx=512, prompt_layout=False); "
            "llm.eval(llm.tokenize(b'one two three four five six')); "
            "print(m.state(), e.products(), m.DESCRIPTION in exactness.configuration(llm))") % _model_path("gemma")
    env = dict(os.environ, NGRAMCACHE_EXACT_MATMUL="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["off", "0", "False"]
