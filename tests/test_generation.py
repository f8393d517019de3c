"""The speculative loop (generate, stream, Sampler) against a deterministic fake model:
whatever is drafted, the output must be exactly what plain decoding gives, and the KV
bookkeeping must stay consistent through every rollback."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import PROMPT, V, reference
from ngramcache import CopyDrafter, Gate, GatedDrafter, LookupDrafter, NgramCache, OracleDrafter
from ngramcache.integrations.llama import generate, stream
from support import FakeModel, RejectingDrafter


DRAFTER_SETTINGS = [
    dict(n_draft=1), dict(n_draft=2), dict(n_draft=3), dict(n_draft=8), dict(n_draft=15),
    dict(n_draft=4, ngram_min=2, ngram_max=4), dict(n_draft=4, ngram_min=1, ngram_max=2),
    dict(n_draft=4, ngram_min=3, ngram_max=3), dict(n_draft=0),
]


@pytest.mark.parametrize("kw", DRAFTER_SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_lookup_output_equals_plain(kw):
    want = reference(PROMPT, 150)
    fm = FakeModel()
    plain = generate(fm, PROMPT, None, 150)
    assert plain.tokens.tolist() == want
    assert fm.decodes[:3] == [16, 16, 8] and set(fm.decodes[3:]) == {1}
    fm = FakeModel()
    r = generate(fm, PROMPT, LookupDrafter(**kw), 150)
    assert r.tokens.tolist() == want
    # the cache holds the prompt and every generated token but the last
    assert fm.kv == PROMPT + want[:-1]
    assert r.accepted <= r.drafted
    assert sum(r.accept_lengths) == r.accepted
    assert r.n_tokens == len(r.accept_lengths) + r.accepted + 1
    if kw["n_draft"] >= 2:
        assert r.drafted > r.accepted > 0  # both acceptance and rejection happened


def test_dynamic_static_and_gated_drafters_equal_plain():
    want = reference(PROMPT, 200)
    dyn = NgramCache()
    dyn.update(reference(PROMPT[:20], 300))
    static = NgramCache()
    static.update([(i * 11) % V for i in range(500)], 2, 2)
    gate = Gate([1.0, 1.1, 1.2, 1.3, 1.5, 1.6, 1.8, 2.0, 2.2])
    for drafter in (LookupDrafter(dynamic=dyn), LookupDrafter(static=static),
                    LookupDrafter(dynamic=dyn, static=static, n_draft=5),
                    GatedDrafter(LookupDrafter(), gate), GatedDrafter(LookupDrafter(n_draft=2), Gate([1.0, 5.0, 9.0])),
                    CopyDrafter(), GatedDrafter(CopyDrafter(n_draft=4), Gate([1.0, 1.1, 1.2, 1.3, 1.5])),
                    CopyDrafter(static=static, dynamic=dyn, min_match=3, n_draft=12)):
        fm = FakeModel()
        r = generate(fm, PROMPT, drafter, 200)
        assert r.tokens.tolist() == want, drafter
        assert fm.kv == PROMPT + want[:-1]


def test_rejection_at_every_draft_position():
    want = reference(PROMPT, 300)
    fm = FakeModel()
    d = RejectingDrafter(n_draft=6)
    r = generate(fm, PROMPT, d, 300)
    assert r.tokens.tolist() == want
    assert fm.kv == PROMPT + want[:-1]
    # rejected at position 0..5 and fully accepted (6) all occurred
    assert set(r.accept_lengths) == set(range(7))


def test_oracle_is_always_right():
    want = reference(PROMPT, 100)
    fm = FakeModel()
    r = generate(fm, PROMPT, OracleDrafter(want, n_draft=8), 100)
    assert r.tokens.tolist() == want
    assert r.accepted == r.drafted > 0
    assert all(a == 8 for a in r.accept_lengths[:-1])


def test_max_tokens_exact_and_zero():
    for n in (0, 1, 2, 5, 9, 17):
        fm = FakeModel()
        r = generate(fm, PROMPT, OracleDrafter(reference(PROMPT, 40), n_draft=8), n)
        assert r.tokens.tolist() == reference(PROMPT, n)


def test_eos_inside_accepted_draft():
    want = reference(PROMPT, 200)
    eos = want[57]  # some token that appears mid-way
    stop = want.index(eos)
    fm = FakeModel(eos=eos)
    r = generate(fm, PROMPT, OracleDrafter(want, n_draft=8), 200)
    assert r.tokens.tolist() == want[: stop + 1]
    assert r.stop_reason == "eos"
    r2 = generate(FakeModel(eos=eos), PROMPT, None, 200)
    assert r2.tokens.tolist() == r.tokens.tolist()
    r3 = generate(FakeModel(eos=eos), PROMPT, None, 200, stop_at_eos=False)
    assert r3.tokens.tolist() == want


def test_context_limit_same_as_plain():
    fm = FakeModel(n_ctx=len(PROMPT) + 30)
    plain = generate(fm, PROMPT, None, 100)
    fm = FakeModel(n_ctx=len(PROMPT) + 30)
    spec = generate(fm, PROMPT, LookupDrafter(n_draft=8), 100)
    assert plain.stop_reason == spec.stop_reason == "context"
    assert spec.tokens.tolist() == plain.tokens.tolist() == reference(PROMPT, plain.n_tokens)


def test_prompt_longer_than_batch_and_draft_capped_by_batch():
    prompt = [(i * 13 + 5) % V for i in range(100)]
    fm = FakeModel(n_batch=4)
    r = generate(fm, prompt, LookupDrafter(n_draft=12), 120)
    assert r.tokens.tolist() == reference(prompt, 120)
    assert max(fm.decodes) <= 4


def test_every_token_is_argmax_of_its_row():
    rows = {}

    def on_logits(i, row):
        rows.setdefault(i, []).append(int(np.argmax(row)))

    fm = FakeModel(peaked=False)
    r = generate(fm, PROMPT, LookupDrafter(n_draft=6), 120, on_logits=on_logits)
    for i, t in enumerate(r.tokens.tolist()):
        assert rows[i][-1] == t
    assert r.tokens.tolist() == reference(PROMPT, 120)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_sampling_same_text_with_or_without_drafts(temperature):
    outs = []
    for drafter in (None, LookupDrafter(n_draft=4), RejectingDrafter(5), LookupDrafter(n_draft=1)):
        fm = FakeModel(peaked=False)
        r = generate(fm, PROMPT, drafter, 120, temperature=temperature, seed=1234)
        outs.append(r.tokens.tolist())
        assert fm.kv == PROMPT + outs[-1][:-1]
    assert all(o == outs[0] for o in outs)
    other = generate(FakeModel(peaked=False), PROMPT, None, 120, temperature=temperature, seed=99)
    assert other.tokens.tolist() != outs[0]
    assert outs[0] != reference(PROMPT, 120)  # it did sample, not argmax


def test_sampler_follows_the_distribution():
    from ngramcache.decoding.loop import Sampler

    row = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    s = Sampler(1.0, 0, 1.0, seed=7)
    n = 20000
    counts = np.bincount([s(row) for _ in range(n)], minlength=4) / n
    assert np.allclose(counts, [0.5, 0.3, 0.15, 0.05], atol=0.015)
    s = Sampler(1.0, 2, 1.0, seed=7)  # top_k=2 renormalises over the best two
    counts = np.bincount([s(row) for _ in range(n)], minlength=4) / n
    assert np.allclose(counts, [0.625, 0.375, 0, 0], atol=0.015)
    s = Sampler(1.0, 0, 0.7, seed=7)  # top_p=0.7: smallest set with mass >= 0.7
    counts = np.bincount([s(row) for _ in range(n)], minlength=4) / n
    assert np.allclose(counts, [0.625, 0.375, 0, 0], atol=0.015)


def test_stream_pieces_and_callbacks():
    seen = []
    st = stream(FakeModel(), PROMPT, LookupDrafter(n_draft=5), 60,
                on_tokens=lambda toks, n_ok: seen.append((list(toks), n_ok)))
    pieces = list(st)
    assert "".join(pieces) == st.result.text
    assert [t for toks, _ in seen for t in toks] == st.result.tokens.tolist()
    assert sum(n for _, n in seen) == st.result.accepted
    assert st.result.text == "".join(f"<{t}>" for t in reference(PROMPT, 60))


def test_clocks_and_result_fields():
    r = generate(FakeModel(), PROMPT, LookupDrafter(), 80)
    assert 0 <= r.t_prompt <= r.t_total
    assert r.t_draft >= 0 and r.t_verify > 0
    assert r.t_prompt + r.t_draft + r.t_verify <= r.t_total * 1.01 + 1e-3
    assert r.n_prompt == len(PROMPT)
    assert r.gen_tokens_per_s > 0 and r.e2e_tokens_per_s > 0
    assert 0 <= r.acceptance <= 1


def test_bad_inputs():
    with pytest.raises(ValueError, match="empty"):
        generate(FakeModel(), "", None, 10)
    with pytest.raises(ValueError, match="empty"):
        generate(FakeModel(), [], None, 10)
    with pytest.raises(ValueError, match="max_tokens"):
        generate(FakeModel(), PROMPT, None, -1)
    with pytest.raises(ValueError, match="temperature"):
        generate(FakeModel(), PROMPT, None, 5, temperature=-0.5)
    with pytest.raises(ValueError, match="top_p"):
        generate(FakeModel(), PROMPT, None, 5, temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="too long"):
        generate(FakeModel(n_ctx=10), PROMPT, None, 5)
    with pytest.raises(TypeError, match="Drafter"):
        generate(FakeModel(), PROMPT, object(), 5)
    with pytest.raises(TypeError, match="Backend"):
        generate(object(), PROMPT, None, 5)
    with pytest.raises(ValueError, match="n_draft"):
        LookupDrafter(n_draft=-1)


# --- the prompt cache: a prompt sharing a prefix with the KV cache decodes only the rest


def _kv_checked(m: FakeModel, pc) -> None:
    # what the PromptCache says the KV cache holds is what it holds
    assert pc.tokens.tolist() == m.kv


@pytest.mark.parametrize("drafted", [False, True])
def test_prompt_cache_reuses_the_shared_prefix(drafted):
    from ngramcache import PromptCache

    m = FakeModel(n_batch=8)
    pc = PromptCache()
    d = CopyDrafter(n_draft=6) if drafted else None
    prompt = list(PROMPT)
    r1 = generate(m, prompt, d, 30, prompt_cache=pc)
    assert r1.n_cached == 0 and r1.tokens.tolist() == reference(prompt, 30)
    _kv_checked(m, pc)
    # the next turn: the whole first exchange plus new tokens
    turn2 = prompt + r1.tokens.tolist() + [5, 6, 7]
    before = len(m.decodes)
    r2 = generate(m, turn2, d, 25, prompt_cache=pc)
    assert r2.n_cached == len(prompt) + 29  # the last generated token was never decoded
    assert r2.tokens.tolist() == reference(turn2, 25)
    # the prompt decode covered only the tokens after the kept prefix
    assert m.decodes[before] == len(turn2) - r2.n_cached
    _kv_checked(m, pc)


def test_prompt_cache_diverging_prompt_and_same_prompt():
    from ngramcache import PromptCache

    m = FakeModel(n_batch=8)
    pc = PromptCache()
    prompt = list(PROMPT)
    generate(m, prompt, None, 10, prompt_cache=pc)
    other = prompt[:5] + [(t + 1) % V for t in prompt[5:]]
    r = generate(m, other, None, 10, prompt_cache=pc)
    assert r.n_cached == 5 and r.tokens.tolist() == reference(other, 10)
    again = generate(m, other, None, 10, prompt_cache=pc)
    assert again.n_cached == len(other) - 1  # the last prompt token is decoded for its logits
    assert again.tokens.tolist() == r.tokens.tolist()
    _kv_checked(m, pc)


def test_prompt_cache_after_an_abandoned_stream_and_after_an_error():
    from ngramcache import PromptCache

    m = FakeModel(n_batch=8)
    pc = PromptCache()
    prompt = list(PROMPT)
    s = iter(stream(m, prompt, CopyDrafter(n_draft=4), 40, prompt_cache=pc))
    next(s), next(s), next(s)
    s.close()  # a client went away between steps: the KV cache is still consistent
    _kv_checked(m, pc)
    assert len(pc) > len(prompt)
    r = generate(m, prompt, None, 12, prompt_cache=pc)
    assert r.n_cached == len(prompt) - 1 and r.tokens.tolist() == reference(prompt, 12)

    class Failing(FakeModel):
        fail = False

        def decode(self, tokens, pos0, logits_from):
            if self.fail and len(self.kv) > len(prompt):
                raise RuntimeError("decode failed")
            super().decode(tokens, pos0, logits_from)

    f = Failing(n_batch=8)
    pc = PromptCache()
    generate(f, prompt, None, 5, prompt_cache=pc)
    f.fail = True
    with pytest.raises(RuntimeError):
        generate(f, prompt + [1, 2], None, 5, prompt_cache=pc)
    assert len(pc) == 0  # not trusted after an error: the next request decodes everything
    f.fail = False
    r = generate(f, prompt + [1, 2], None, 5, prompt_cache=pc)
    assert r.n_cached == 0 and r.tokens.tolist() == reference(prompt + [1, 2], 5)


def test_prompt_cache_only_for_its_backend_and_refused_when_the_backend_cannot_keep():
    from ngramcache import PromptCache

    a, b = FakeModel(), FakeModel()
    pc = PromptCache()
    generate(a, list(PROMPT), None, 5, prompt_cache=pc)
    assert generate(b, list(PROMPT), None, 5, prompt_cache=pc).n_cached == 0

    class Windowed(FakeModel):
        def can_keep(self, n):
            return False

    w = Windowed()
    pc = PromptCache()
    generate(w, list(PROMPT), None, 5, prompt_cache=pc)
    r = generate(w, list(PROMPT), None, 5, prompt_cache=pc)
    assert r.n_cached == 0 and r.tokens.tolist() == reference(list(PROMPT), 5)
    with pytest.raises(TypeError, match="PromptCache"):
        generate(a, list(PROMPT), None, 5, prompt_cache=object())


def test_on_tokens_returning_true_stops():
    m = FakeModel()
    seen = []

    def on_tokens(tokens, n_from_draft):
        seen.extend(tokens)
        return len(seen) >= 7

    r = generate(m, list(PROMPT), CopyDrafter(n_draft=4), 50, on_tokens=on_tokens)
    assert r.stop_reason == "stop"
    assert r.tokens.tolist() == seen and len(seen) >= 7
    assert seen == reference(list(PROMPT), len(seen))


def test_should_stop_is_taken_between_the_prompt_pass_pieces():
    from ngramcache.decoding.loop import PromptCache

    m = FakeModel(n_batch=16)
    prompt = (list(PROMPT) * 10)[:100]
    asked = []

    def should_stop():
        asked.append(len(m.kv))
        return len(asked) >= 2  # after two pieces of the prompt

    cache = PromptCache()
    r = generate(m, prompt, CopyDrafter(n_draft=4), 20, should_stop=should_stop, prompt_cache=cache)
    assert r.stop_reason == "stop" and r.n_tokens == 0
    assert m.decodes == [16, 16] and asked == [16, 32]
    assert cache.reusable(m, np.asarray(prompt, dtype=np.int32)) == 0  # a half-read prompt is not kept
    # never asked to stop: the whole prompt, then the answer
    r = generate(m, prompt, CopyDrafter(n_draft=4), 20, should_stop=lambda: False)
    assert r.tokens.tolist() == reference(prompt, 20)


def test_the_loop_reports_each_verifications_size_and_time_to_the_drafter():
    times = []

    class Timed(RejectingDrafter):
        def verified(self, n_tokens, seconds):
            times.append((n_tokens, seconds))

    fm = FakeModel()
    r = generate(fm, PROMPT, Timed(n_draft=4), 60)
    assert r.tokens.tolist() == reference(PROMPT, 60)
    # one report per step after the prompt's pass, sized as the decode it timed
    assert len(times) == r.steps and [n for n, _ in times] == fm.decodes[-r.steps:]
    assert all(0 < s < r.t_total for _, s in times)
    assert sum(s for _, s in times) == pytest.approx(r.t_verify)
