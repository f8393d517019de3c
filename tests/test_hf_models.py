"""ngramcache.integrations.hf on the packaged GGUF models (SmolLM2, Gemma 3 270M), loaded by
transformers itself: greedy output identical to plain ``generate`` on real prompts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ngramcache import data, hf  # noqa: E402
from ngramcache.drafters.catalog import DRAFTERS, make_drafter  # noqa: E402
from support import own_cost_store, plain  # noqa: E402,F401  (the fixture too)


def _real_prompts() -> list[str]:
    return [
        data.type_hints_task().prompt,
        data.conversation_task().prompt,
        data.rag_task(limit=1200).prompt,
        data.summary_task(limit=1200).prompt,
        data.open_task().prompt,
        "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog.",
    ]


@pytest.fixture(scope="session")
def smollm2():
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    try:
        return hf.load_model("smollm2")
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("i", range(6))
def test_smollm2_greedy_identical_every_drafter(smollm2, i):
    model, tok = smollm2
    assert isinstance(model, transformers.LlamaForCausalLM) and model.dtype == torch.float32
    ids = hf.chat_input_ids(tok, _real_prompts()[i])
    n_new = 24
    ref = plain(model, ids, max_new_tokens=n_new)
    drafted = accepted = 0
    for name in DRAFTERS:
        d = make_drafter(name, n_draft=10)
        out = hf.generate(model, ids, d, max_new_tokens=n_new, do_sample=False)
        assert torch.equal(out, ref), (name, tok.decode(ref[0, ids.shape[1]:]), tok.decode(out[0, ids.shape[1]:]))
        drafted += d.stats.drafted
        accepted += d.stats.accepted
    if i == 5:  # the model answers and stops at its EOS (<|im_end|>) before max_new_tokens
        eos = model.generation_config.eos_token_id
        eos = set(eos) if isinstance(eos, (list, tuple)) else {eos}
        assert ref.shape[1] < ids.shape[1] + n_new and ref[0, -1].item() in eos
    if i < 2:  # copy-heavy prompts: drafts are proposed and accepted
        assert accepted > 0


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_adaptive_and_sampling(smollm2):
    model, tok = smollm2
    ids = hf.chat_input_ids(tok, data.type_hints_task().prompt)
    ref = plain(model, ids, max_new_tokens=16)
    d = hf.adaptive_drafter(model, "copy", n_draft=8, costs=[1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4])
    assert torch.equal(hf.generate(model, ids, d, max_new_tokens=16, do_sample=False), ref)
    torch.manual_seed(0)
    out = hf.generate(model, ids, "copy", max_new_tokens=16, do_sample=True, temperature=0.8)
    assert out.shape[1] <= ids.shape[1] + 16 and torch.equal(out[:, : ids.shape[1]], ids)


@pytest.mark.model
@pytest.mark.slow
def test_gemma3_greedy_identical():
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    try:
        model, tok = hf.load_model("gemma")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert type(model).__name__ == "Gemma3ForCausalLM"
    ids = hf.chat_input_ids(tok, data.type_hints_task().prompt)  # a base model: the raw prompt
    ref = plain(model, ids, max_new_tokens=16)
    for name in ("copy", "suffix", "pld"):
        d = make_drafter(name, n_draft=8)
        assert torch.equal(hf.generate(model, ids, d, max_new_tokens=16, do_sample=False), ref), name
