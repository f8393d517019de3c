"""Real models verifying drafts (llama-cpp-python + the GGUF models shipped in PyPI packages).

Both packaged models are loaded by ``make_llama`` without weight repacking and with ggml's
tiled matmul off; on the llama.cpp build the project installs (-DGGML_LLAMAFILE=OFF) their
batched logits then equal their single-token logits bit for bit, so speculative output must
equal plain greedy exactly: asserted with ``==`` (tests/test_exactness.py covers every
drafter on many prompts). A model loaded with llama-cpp-python's defaults (weights
repacked) is not exact; there the guarantee checked is the weaker one, that every emitted
token is the argmax of the logits computed for it, and a divergence from plain greedy is
reported with plain's top-2 logit gap there.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.model

llama_cpp = pytest.importorskip("llama_cpp")

from conftest import PROMPTS  # noqa: E402
from ngramcache import LookupDrafter  # noqa: E402
from ngramcache import llama as nl  # noqa: E402
from ngramcache.integrations import exactness  # noqa: E402
from ngramcache.models import default_model_path  # noqa: E402


N = 24


def _run_recording(llm, prompt, drafter, n, **kw):
    """(result, {token index: (argmax, top-2 gap)} of the logits that decided it)."""
    rows: dict[int, tuple[int, float]] = {}

    def on_logits(i, row):
        top2 = np.partition(row, -2)[-2:]
        rows[i] = (int(np.argmax(row)), float(top2[1] - top2[0]))  # the last row seen decides

    r = nl.generate(llm, prompt, drafter, n, on_logits=on_logits, **kw)
    return r, rows


def _first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@pytest.fixture(scope="module")
def gemma(gemma_path):
    llm = nl.make_llama(gemma_path, n_ctx=1024, n_batch=64)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def gemma_plain(gemma):
    return [_run_recording(gemma, p, None, N) for p in PROMPTS]


def test_gemma_generate_identical_to_plain(gemma, gemma_plain):
    total_drafted = total_rejected = 0
    for i, (prompt, (plain, prow)) in enumerate(zip(PROMPTS, gemma_plain)):
        assert plain.n_tokens == N or plain.stop_reason == "eos"
        # fixed drafts of 8: many drafts, many rejections and rollbacks
        spec, srow = _run_recording(gemma, prompt, LookupDrafter(n_draft=8), N)
        # every emitted token is the argmax of the logits the model computed for it
        assert [srow[k][0] for k in range(spec.n_tokens)] == spec.tokens.tolist()
        assert spec.tokens.tolist() == plain.tokens.tolist(), f"prompt {i}"
        # and the very rows that decided them are plain's, gap for gap
        assert [srow[k][1] for k in range(spec.n_tokens)] == [prow[k][1] for k in range(plain.n_tokens)]
        total_drafted += spec.drafted
        total_rejected += sum(1 for a in spec.accept_lengths if a < 8)
    assert total_drafted > 50 and total_rejected > 5


def test_gemma_adaptive_identical_and_drafts_on_copying(gemma, gemma_plain):
    d = nl.adaptive_drafter(gemma, n_draft=8)
    r = nl.generate(gemma, PROMPTS[0], d, N)
    plain, prow = gemma_plain[0]
    assert r.tokens.tolist() == plain.tokens.tolist()
    assert r.accepted > N // 3  # the prompt asks for a copy: drafts must be taken


def test_gemma_llama_cpp_draft_model_identical(gemma_path, gemma, gemma_plain):
    # n_batch=64 < prompt length: llama-cpp-python 0.3.36's logits_all bug would fire
    # without make_llama's configuration
    llm = nl.make_llama(gemma_path, drafter=nl.LlamaDrafter(LookupDrafter(n_draft=8)), n_ctx=1024, n_batch=64)
    try:
        assert any(p.n_prompt > 64 for p, _ in gemma_plain)
        for i, (prompt, (plain, _)) in enumerate(zip(PROMPTS, gemma_plain)):
            r = nl.generate_llama_cpp(llm, prompt, N)
            assert r.tokens.tolist() == plain.tokens.tolist(), f"prompt {i}"
        out = llm.create_completion(PROMPTS[0], max_tokens=N, temperature=0.0, repeat_penalty=1.0)
        assert out["choices"][0]["text"] == gemma_plain[0][0].text
        assert llm.draft_model.stats.accepted > 0
    finally:
        llm.close()


def test_known_llama_cpp_bug_is_detected(gemma_path):
    bad = llama_cpp.Llama(model_path=gemma_path, n_ctx=512, n_batch=32, logits_all=False, verbose=False,
                          draft_model=nl.LlamaDrafter(LookupDrafter()))
    try:
        with pytest.raises(ValueError, match="logits_all=True"):
            nl.check_llama(bad)
        with pytest.raises(ValueError, match="logits_all=True"):
            nl.generate_llama_cpp(bad, PROMPTS[0], 4)
        # llama-cpp-python 0.3.36 would fail at the first prompt batch past n_batch ("could not
        # broadcast"); an ngramcache draft model has Llama.eval give the Llama its rows first
        assert len(bad.tokenize(PROMPTS[0].encode())) > 32
        assert bad.create_completion(PROMPTS[0], max_tokens=4, temperature=0.0)["choices"][0]["text"]
        assert bad.scores.shape[0] == bad.n_ctx()
        nl.check_llama(bad)  # room for the whole context now
    finally:
        bad.close()
    with pytest.raises(ValueError, match="logits_all"):
        nl.make_llama(gemma_path, drafter=LookupDrafter(), n_ctx=512, n_batch=32, logits_all=False)


def test_gemma_sampling_respects_seed(gemma):
    prompt = "Once upon a time, in a small village by the sea,"
    a = nl.generate(gemma, prompt, None, 24, temperature=0.9, seed=11)
    b = nl.generate(gemma, prompt, None, 24, temperature=0.9, seed=11)
    c = nl.generate(gemma, prompt, LookupDrafter(n_draft=4), 24, temperature=0.9, seed=11)
    d = nl.generate(gemma, prompt, None, 24, temperature=0.9, seed=12)
    assert a.tokens.tolist() == b.tokens.tolist()
    # one uniform number per emitted token: drafting does not change a seeded text
    assert c.tokens.tolist() == a.tokens.tolist()
    assert d.tokens.tolist() != a.tokens.tolist()


def test_stream_matches_generate(gemma, gemma_plain):
    st = nl.stream(gemma, PROMPTS[0], LookupDrafter(), N)
    assert "".join(st) == gemma_plain[0][0].text
    assert st.result.tokens.tolist() == gemma_plain[0][0].tokens.tolist()


def test_bad_inputs(gemma, tmp_path):
    with pytest.raises(FileNotFoundError, match="model file not found"):
        nl.make_llama(tmp_path / "nope.gguf")
    with pytest.raises(ValueError, match="empty"):
        nl.generate(gemma, "", None, 4)
    with pytest.raises(ValueError, match="n_draft"):
        LookupDrafter(n_draft=-1)
    with pytest.raises(ValueError, match="vocabulary"):
        nl.generate(gemma, [1, 2, 10**8], None, 4)
    with pytest.raises(ValueError, match="too long"):
        nl.generate(gemma, list(range(1, 2000)), None, 4)


# --- SmolLM2, and a model loaded with llama-cpp-python's defaults -------------------------

@pytest.fixture(scope="module")
def smol():
    try:
        path = default_model_path("smollm2")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    llm = nl.make_llama(path, n_ctx=1024, n_batch=64)
    yield llm
    llm.close()


def test_smollm2_generate_identical_to_plain(smol):
    for i, prompt in enumerate(PROMPTS[:4]):
        plain, prow = _run_recording(smol, prompt, None, N)
        spec, srow = _run_recording(smol, prompt, LookupDrafter(n_draft=8), N)
        for res, rows in ((plain, prow), (spec, srow)):
            assert [rows[k][0] for k in range(res.n_tokens)] == res.tokens.tolist()
        assert spec.tokens.tolist() == plain.tokens.tolist(), f"prompt {i}"


@pytest.fixture(scope="module")
def gemma_repacked(gemma_path):
    """Gemma loaded as llama-cpp-python loads it: weights repacked for the CPU's kernels."""
    llm = nl.make_llama(gemma_path, n_ctx=1024, n_batch=64, exact=False)
    yield llm
    llm.close()


def test_repacked_weights_are_not_exact(gemma_repacked):
    assert exactness.weight_repacking(gemma_repacked)
    report = exactness.measure_exactness(gemma_repacked, PROMPTS[0], n_tokens=16)
    assert report.rows_equal < report.rows and report.max_abs_diff > 0
    assert any("repacking" in c for c in report.causes)


def test_not_exact_every_token_is_argmax_of_its_verified_logits(gemma_repacked, record_property):
    report = []
    for prompt in PROMPTS[:4]:
        plain, prow = _run_recording(gemma_repacked, prompt, None, N)
        spec, srow = _run_recording(gemma_repacked, prompt, LookupDrafter(n_draft=8), N)
        for res, rows in ((plain, prow), (spec, srow)):
            assert [rows[i][0] for i in range(res.n_tokens)] == res.tokens.tolist()
        div = _first_divergence(plain.tokens.tolist(), spec.tokens.tolist())
        report.append("identical" if div is None else
                      f"diverges at token {div}, top-2 gap there {prow[div][1]:.3f} (plain) / "
                      f"{srow[div][1]:.3f} (batched)")
    record_property("repacked_divergence", "; ".join(report))
    print("\nGemma with repacked weights vs plain greedy: " + "; ".join(report))
