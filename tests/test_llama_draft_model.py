"""LlamaDrafter in a Llama made by hand: llama-cpp-python 0.3.36 keeps every token's logits once
it has a draft model but, with logits_all=False, has room for only n_batch of them; making a
LlamaDrafter has Llama.eval give such a Llama the rows it lacks before it evaluates, the first
prompt included. make_llama and check_llama name the ways that need no such repair."""

from __future__ import annotations

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import ngramcache as nc  # noqa: E402
from ngramcache.integrations.exactness import no_weight_repacking  # noqa: E402
from ngramcache.integrations.llama_draft_model import (CountingDraftModel, LlamaDrafter,  # noqa: E402
                                                       check_llama, grow_score_rows)
from ngramcache.models import default_model_path  # noqa: E402


class ShortBuffer(llama_cpp.Llama):
    """The state of a Llama made with a draft model and logits_all=False, without a model:
    ``rows`` rows of logits for a context of ``n_ctx``, ``n_tokens`` evaluated."""

    def __init__(self, rows: int, n_ctx: int, n_vocab: int = 5, n_tokens: int = 3):
        self.scores = np.arange(rows * n_vocab, dtype=np.single).reshape(rows, n_vocab)
        self._ctx_size, self.n_tokens, self.draft_model = n_ctx, n_tokens, None

    def n_ctx(self) -> int:
        return self._ctx_size

    def __del__(self):  # no model to free
        pass


def test_grow_score_rows_keeps_the_evaluated_rows_and_leaves_a_full_buffer_alone():
    llm = ShortBuffer(rows=8, n_ctx=32)
    before = llm.scores[:3].copy()
    assert grow_score_rows(llm) is True
    assert llm.scores.shape == (32, 5) and np.array_equal(llm.scores[:3], before)
    scores = llm.scores
    assert grow_score_rows(llm) is False and llm.scores is scores
    llm.draft_model = LlamaDrafter(nc.CopyDrafter(n_draft=4))
    check_llama(llm)  # room for the whole context now: nothing to refuse


def test_the_row_guard_wraps_llama_eval_once():
    LlamaDrafter(nc.CopyDrafter())
    guarded = llama_cpp.Llama.eval
    assert guarded._ngramcache_row_guard is True
    CountingDraftModel(LlamaDrafter(nc.CopyDrafter()))
    assert llama_cpp.Llama.eval is guarded  # not wrapped twice
    assert guarded.__wrapped__.__qualname__ == "Llama.eval"


def test_check_llama_names_make_llama_and_generate():
    llm = ShortBuffer(rows=8, n_ctx=32)
    llm.draft_model = LlamaDrafter(nc.CopyDrafter())
    with pytest.raises(ValueError, match=r"make_llama.*ngramcache\.llama\.generate"):
        check_llama(llm)


@pytest.mark.model
def test_a_hand_made_llama_with_a_drafter_takes_a_first_prompt_past_n_batch_and_equals_plain_decoding():
    """Created as llama-cpp-python's docs show (logits_all=False by default) with n_batch 32:
    without the row guard its first prompt of more than 32 tokens fails with "could not
    broadcast input array ... into shape (0,)" before any draft model runs. SmolLM2 has no
    repacked matrices, so with repacking off (and the tiled matmul off, tests/conftest.py) the
    drafts change nothing: == plain decoding."""
    try:
        path = default_model_path("smollm2")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    prompt = "Repeat exactly: " + "one two three four five six seven eight nine ten. " * 6
    kw = dict(n_ctx=512, n_batch=32, n_threads=2, n_threads_batch=2, verbose=False)
    with no_weight_repacking():
        drafted = llama_cpp.Llama(path, draft_model=LlamaDrafter(nc.CopyDrafter()), **kw)
        plain = llama_cpp.Llama(path, **kw)
        counted = llama_cpp.Llama(path, draft_model=CountingDraftModel(LlamaDrafter(nc.CopyDrafter())), **kw)
    assert drafted.scores.shape[0] == 32  # llama-cpp-python's short buffer
    assert len(drafted.tokenize(prompt.encode())) > 32  # the first prompt passes n_batch
    want = plain.create_completion(prompt, max_tokens=48, temperature=0.0)["choices"][0]["text"]
    got = drafted.create_completion(prompt, max_tokens=48, temperature=0.0)["choices"][0]["text"]
    assert drafted.scores.shape[0] == drafted.n_ctx()
    assert got == want
    assert counted.create_completion(prompt, max_tokens=48, temperature=0.0)["choices"][0]["text"] == want
    assert counted.draft_model.proposals  # the wrapped drafter drafted
