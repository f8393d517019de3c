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

# ggml's numbers: the weight type, its block (weights, bytes), the tokens' type and block bytes
TYPES = {"q8_0": (8, 32, 34, 8, 34), "q5_0": (6, 32, 22, 8, 34), "q4_0": (2, 32, 18, 8, 34),
         "q4_1": (3, 32, 20, 9, 36), "q5_1": (7, 32, 24, 9, 36),
         "iq4_nl": (20, 32, 18, 8, 34), "q4_k": (12, 256, 144, 15, 292), "q5_k": (13, 256, 176, 15, 292),
         "q6_k": (14, 256, 210, 15, 292), "iq4_xs": (23, 256, 136, 15, 292)}


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
        return _FROM_FLOAT(t.from_float), _VEC_DOT(t.vec_dot) if t.vec_dot else None, t.vec_dot_type

    return traits


def _quantize(from_float, rows: np.ndarray, elems: int, block: int) -> np.ndarray:
    k = rows.shape[1]
    out = np.zeros(rows.shape[0] * k // elems * block, np.uint8)
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    for r in range(rows.shape[0]):
        from_float(rows[r].ctypes.data, out.ctypes.data + r * k // elems * block, k)
    return out


def _cases(rng, elems: int):
    """Weights and tokens: random with row scales spread over decades, constant rows (every
    quant at its extreme), zero blocks, alternating signs, one huge element per block."""
    k = 768 if elems == 256 else 640
    yield "random", rng.standard_normal((13, k)) * rng.uniform(1e-3, 30, (13, 1)), \
        rng.standard_normal((9, k)) * rng.uniform(1e-2, 100, (9, 1))
    yield "extremes", np.tile([1.0, -1.0], (7, 1024)), np.tile([-3.0, 3.0], (5, 1024))
    k = 3 * elems
    w = rng.standard_normal((6, k))
    w[:, elems:2 * elems] = 0.0
    x = rng.standard_normal((4, k))
    x[1] = 0.0
    yield "zero blocks", w, x
    w = rng.standard_normal((5, 2048)) * 1e-3
    w[:, ::32] = 50.0
    yield "outliers", w, rng.standard_normal((17, 2048))
    w = rng.uniform(0, 1, (7, 512)) ** 4  # skewed, all positive: a K-quant's minimums at work
    yield "skewed", w, rng.standard_normal((6, 512)) + 2.0


KERNELS = ["avx2"] + (["avx512vnni"] if _exact_matmul.kernels() == "avx512vnni" else [])


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("name", sorted(TYPES))
def test_kernel_sums_equal_ggml_one_token_sums_bit_for_bit(ggml_cpu, name, kernels):
    type_id, elems, block, token_type, token_block = TYPES[name]
    from_float_w, vec_dot, vec_dot_type = ggml_cpu(type_id)
    assert vec_dot_type == token_type  # the token format ggml's one-token kernel reads
    from_float_tok, _, _ = ggml_cpu(token_type)
    rng = np.random.default_rng(7)
    s = ctypes.c_float()
    for label, w, x in _cases(rng, elems):
        k, m, n = w.shape[1], w.shape[0], x.shape[0]
        wq = _quantize(from_float_w, w, elems, block)
        xq = _quantize(from_float_tok, x, elems if elems == 256 else 32, token_block)
        wrow, xrow = wq.size // m, xq.size // n
        ref = np.zeros((n, m), np.float32)
        for c in range(n):
            for r in range(m):
                vec_dot(k, ctypes.byref(s), 0, wq.ctypes.data + r * wrow, 0, xq.ctypes.data + c * xrow, 0, 1)
                ref[c, r] = s.value
        for width in range(1, n + 1):  # every batch width, so every tile shape and remainder
            got = np.frombuffer(_exact_matmul.dot_rows(type_id, wq, xq[: width * xrow], k, kernels),
                                np.float32).reshape(width, m)
            assert np.array_equal(got.view(np.uint32), ref[:width].view(np.uint32)), (label, width)


def test_kernel_rejects_what_it_cannot_read():
    with pytest.raises(ValueError, match="type"):
        _exact_matmul.dot_rows(10, b"\0" * 84, b"\0" * 292, 256)  # Q2_K: not one of its types
    with pytest.raises(ValueError, match="multiple of 32"):
        _exact_matmul.dot_rows(8, b"\0" * 34, b"\0" * 34, 20)
    with pytest.raises(ValueError, match="whole rows"):
        _exact_matmul.dot_rows(8, b"\0" * 35, b"\0" * 34, 32)
    with pytest.raises(ValueError, match="kernels must be"):
        _exact_matmul.dot_rows(8, b"\0" * 34, b"\0" * 34, 32, "sse2")
    with pytest.raises(ValueError, match="at least 1"):
        _exact_matmul.register_backend({}, 0)
    with pytest.raises(ValueError, match="at least 1"):
        _exact_matmul.set_min_batch(0)


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
    assert _exact_matmul.products() > before  # single tokens: its sums are ggml's, sooner
    before = _exact_matmul.products()
    backend.decode(toks[1:9], 1, 0)
    assert _exact_matmul.products() > before  # a batch's weight products
    # llama.cpp reuses a graph of the same shape with its backends; a new shape asks again
    _exact_matmul.set_min_batch(2)
    try:
        before = _exact_matmul.products()
        backend.decode(toks[9:10], 9, 0)
        assert _exact_matmul.products() == before  # now left to ggml's CPU backend
    finally:
        _exact_matmul.set_min_batch(1)
    before = _exact_matmul.products()
    report = exactness.measure_exactness(llm)
    assert _exact_matmul.products() > before
    assert report.rows == report.rows_equal == exactness.CHECK_TOKENS
    llm.close()


def test_environment_keeps_it_out():
    code = ("import ngramcache.llama as nl; from ngramcache.integrations import llama_exact_matmul as m, exactness; "
            "from ngramcache import _exact_matmul as e; llm = nl.make_llama(%r, n_ctx=512, prompt_layout=False); "
            "llm.eval(llm.tokenize(b'one two three four five six')); "
            "print(m.state(), e.products(), m.DESCRIPTION in exactness.configuration(llm), m.products_by()); "
            "print(exactness.configuration(llm))") % _model_path("gemma")
    env = dict(os.environ, NGRAMCACHE_EXACT_MATMUL="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, said = out.stdout.splitlines()[:2]
    assert first.split() == ["off", "0", "False", "ggml"]
    assert "weight products in ggml's one-token kernel (ngramcache's: off)" in said
