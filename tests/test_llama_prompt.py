"""The prompt through repacked weights, the tokens after it through the exact ones
(ngramcache.integrations.llama_prompt): the GGUF header reader against the gguf package, which
models get the second layout, and on Gemma 3 (Q4_K weights, repacked on x86-64) that drafting
still gives plain decoding's tokens, with prompts handed over whole, in pieces, after a
prompt cache and after a sliding window moved on."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from ngramcache.integrations.llama_prompt import MIN_REPACKED_SHARE, gguf_tensor_types, repacked_share
from ngramcache.models import default_model_path

llama_cpp = pytest.importorskip("llama_cpp")
import ngramcache.llama as nl  # noqa: E402
from ngramcache.decoding.loop import PromptCache  # noqa: E402
from ngramcache.drafters.registry import make_drafter  # noqa: E402

X86 = platform.machine().lower() in ("x86_64", "amd64")
SYSTEM = llama_cpp.llama_print_system_info().decode()


def _path(name: str) -> str:
    try:
        return default_model_path(name)
    except FileNotFoundError as e:
        pytest.skip(str(e))


# ---------------------------------------------------------------------------------------------
# the header reader

@pytest.mark.parametrize("name", ["smollm2", "gemma"])
def test_tensor_types_equal_the_gguf_packages(name):
    gguf = pytest.importorskip("gguf")
    path = _path(name)
    reader = gguf.GGUFReader(path)
    want = {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape)) for t in reader.tensors}
    got = gguf_tensor_types(path)
    assert got == want
    assert len(got) > 50


def test_not_a_gguf_file_is_named(tmp_path):
    for content, words in ((b"", "empty"), (b"GGML" + bytes(40), "no GGUF magic"),
                           (b"GGUF" + (3).to_bytes(4, "little") + (5).to_bytes(8, "little"), "cut short")):
        p = tmp_path / "x.gguf"
        p.write_bytes(content)
        with pytest.raises(ValueError, match=words):
            gguf_tensor_types(p)


@pytest.mark.skipif(not X86 or "AVX2 = 1" not in SYSTEM, reason="the repacked types are known for x86-64 AVX2")
def test_which_models_are_repacked():
    share = repacked_share(_path("gemma"), SYSTEM)
    assert 0.1 < share < MIN_REPACKED_SHARE  # its Q4_K matrices; most are Q5_0 and Q8_0
    assert repacked_share(_path("smollm2"), SYSTEM) == 0  # Q4_1 and Q8_0: none on x86-64
    assert repacked_share(_path("gemma"), "") == 0  # no AVX2: nothing known to be repacked


# ---------------------------------------------------------------------------------------------
# Gemma 3 with the second layout

N = 24
TEXT = ("The lighthouse keeper climbed the stairs every evening at dusk. He wound the clockwork, trimmed "
        "the wick and polished the great lens until it shone. Ships passed in the dark and never knew his "
        "name, but they knew his light. ") * 6


@pytest.fixture(scope="module")
def gemma():
    path = _path("gemma")
    llm = nl.make_llama(path, n_ctx=2048, n_batch=256, prompt_layout=True)
    one = nl.make_llama(path, n_ctx=2048, n_batch=256, prompt_layout=False)
    yield llm, one
    llm.close()
    one.close()


class _Counting:
    """Counts the prompt layout's prefills and hand-overs."""

    def __init__(self, layout):
        self.layout, self.prefills, self.hand_overs = layout, 0, 0
        self._prefill, self._hand_over = layout.prefill, layout.hand_over
        layout.prefill = self.prefill
        layout.hand_over = self.hand_over

    def prefill(self, *a):
        self.prefills += 1
        return self._prefill(*a)

    def hand_over(self, *a):
        self.hand_overs += 1
        return self._hand_over(*a)

    def restore(self):
        self.layout.prefill, self.layout.hand_over = self._prefill, self._hand_over


@pytest.mark.model
def test_a_layout_only_where_it_pays(gemma):
    llm, one = gemma
    assert llm._ngramcache_prompt_layout is not None  # asked for
    assert getattr(one, "_ngramcache_prompt_layout", None) is None
    for name in ("smollm2", "gemma"):  # by default: no copy where less than half would be repacked
        auto = nl.make_llama(_path(name), n_ctx=512)
        try:
            if X86 and "AVX2 = 1" in SYSTEM:
                assert getattr(auto, "_ngramcache_prompt_layout", None) is None
        finally:
            auto.close()
    with_drafter = nl.make_llama(_path("gemma"), drafter=make_drafter("copy"), n_ctx=512)
    try:  # llama-cpp-python's own loop decodes its prompts itself
        assert getattr(with_drafter, "_ngramcache_prompt_layout", None) is None
    finally:
        with_drafter.close()


@pytest.mark.model
def test_drafting_equals_plain_through_the_layout(gemma):
    llm, _ = gemma
    counting = _Counting(llm._ngramcache_prompt_layout)
    try:
        prompts = [TEXT + "\n\nRepeat the story word for word:\n", "def add(a, b):\n    return a + b\n" * 12]
        for prompt in prompts:
            plain = nl.generate(llm, prompt, None, N)
            for name in ("copy", "lookup", "suffix"):
                drafted = nl.generate(llm, prompt, make_drafter(name, n_draft=8), N)
                assert drafted.tokens.tolist() == plain.tokens.tolist(), (name, prompt[:20])
        assert counting.prefills >= 8 and counting.hand_overs >= 8  # the prompts went through the layout
    finally:
        counting.restore()


@pytest.mark.model
def test_the_handed_over_cache_is_the_prompts(gemma):
    # the layout's KV cache continues the prompt: the first row is the one-layout model's up to
    # the repacked kernels' rounding (measured: correlation 0.996, as close as the repacked model
    # decoding the whole prompt alone, 0.997; the same prompt without its first 20 tokens: 0.79),
    # and the text goes on the same way for a while
    llm, one = gemma
    rows = {}
    a = nl.generate(llm, TEXT, None, 8, on_logits=lambda i, r: rows.setdefault(("two", i), r.copy()))
    b = nl.generate(one, TEXT, None, 8, on_logits=lambda i, r: rows.setdefault(("one", i), r.copy()))
    r2, r1 = rows[("two", 0)], rows[("one", 0)]
    assert np.corrcoef(r1, r2)[0, 1] > 0.99
    assert int(np.argmax(r1)) == int(np.argmax(r2))
    assert a.tokens[:4].tolist() == b.tokens[:4].tolist()


@pytest.mark.model
def test_prompt_cache_and_many_pieces_stay_equal(gemma):
    # a prompt longer than n_batch (pieces, one hand-over), then turns on one prompt cache:
    # plain and drafted runs split each prompt alike, so they stay equal
    llm, _ = gemma
    long = TEXT * 3 + "\n\nNow the same story once more:\n"
    turns = (long, "\nAnd again, shorter:\n", TEXT[:400] + "\nOnce more:\n")

    def chat(drafter_name):
        cache, history, outs = PromptCache(), "", []  # one cache per chain: it trusts one history
        for turn in turns:
            history += turn
            drafter = make_drafter(drafter_name, n_draft=8) if drafter_name else None
            r = nl.generate(llm, history, drafter, N, prompt_cache=cache)
            outs.append(r.tokens.tolist())
            history += r.text
        return outs

    assert chat("copy") == chat(None)


@pytest.mark.model
def test_short_prompts_stay_in_the_exact_context(gemma):
    llm, _ = gemma
    counting = _Counting(llm._ngramcache_prompt_layout)
    try:
        nl.generate(llm, "The capital of France is", None, 4)
        assert counting.prefills == 0
    finally:
        counting.restore()


@pytest.mark.model
def test_the_layouts_memory_is_reported():
    # measured as the growth of anonymous memory while the copy loads: in a fresh process, where
    # no memory freed earlier is there to be reused
    import subprocess
    import sys

    code = ("import ngramcache.llama as nl; llm = nl.make_llama('gemma', n_ctx=2048, prompt_layout=True); "
            "print(llm._ngramcache_prompt_layout.memory_bytes)")
    _path("gemma")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    mib = int(res.stdout.strip().splitlines()[-1]) / 2**20
    assert 10 < mib < 2000  # the repacked Q4_K matrices and a second context


@pytest.fixture(scope="module")
def smollm2_q4_0(tmp_path_factory):
    """SmolLM2 requantized to Q4_0 with llama.cpp's own quantize: every matrix repacked on x86-64."""
    out = tmp_path_factory.mktemp("q4_0") / "smollm2-q4_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    assert llama_cpp.llama_model_quantize(_path("smollm2").encode(), str(out).encode(), params) == 0
    return str(out)


@pytest.mark.model
@pytest.mark.skipif(not X86 or "AVX2 = 1" not in SYSTEM, reason="the repacked types are known for x86-64 AVX2")
def test_a_mostly_repacked_model_gets_the_layout_by_default(smollm2_q4_0):
    assert repacked_share(smollm2_q4_0, SYSTEM) >= MIN_REPACKED_SHARE
    llm = nl.make_llama(smollm2_q4_0, n_ctx=1024)
    try:
        assert llm._ngramcache_prompt_layout is not None
        prompt = TEXT + "\n\nRepeat the story:\n"
        plain = nl.generate(llm, prompt, None, N)
        for name in ("copy", "lookup"):
            assert nl.generate(llm, prompt, make_drafter(name, n_draft=8), N).tokens.tolist() == plain.tokens.tolist()
    finally:
        llm.close()
