"""PromptLookupDrafter: against a rescan of the whole sequence at every step (both match
rules, any n-gram sizes, accept batches of random sizes), against llama-cpp-python's own
LlamaPromptLookupDecoding for match="first" on random and real streams, the C++ replay,
and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FAST, VECTORS, alphabets, streams
from ngramcache import Gate, GatedDrafter, PromptLookupDrafter
from ngramcache.drafters.base import Source
from ngramcache.replays import replay_drafter
from reference_prompt_lookup import prompt_lookup

REAL = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROSE = None if VECTORS is None else np.fromfile(VECTORS / "prose.tokens.i32", dtype="<i4").astype(np.int32)
needs_prose = pytest.mark.skipif(PROSE is None, reason="reference vectors not found (set NGRAMCACHE_VECTORS)")


def follow(d: PromptLookupDrafter, text, start: int, batches, n_maxes, expected) -> int:
    """Feeds ``d`` the text; at every step its proposal must equal ``expected(seq, n)``.
    Returns the number of non-empty proposals."""
    text = np.asarray(text, dtype=np.int32)
    if not any(batches):  # an empty accept now and then, but the text must advance
        batches = [*batches, 1]
    d.reset(text[:start])
    have, step, hits = start, 0, 0
    while True:
        n_max = n_maxes[step % len(n_maxes)]
        got = d.propose(n_max)
        want = expected(text[:have], min(n_max, d.n_draft))
        assert got.tolist() == list(want), f"step {step}, {have} tokens, n_max {n_max}"
        hits += bool(got.size)
        if have == text.size:
            return hits
        k = min(text.size - have, batches[step % len(batches)])
        d.accept(text[have : have + k])
        have += k
        step += 1


def by_rescan(d: PromptLookupDrafter):
    def expected(seq, n):
        want, size = prompt_lookup(seq.tolist(), n, d.max_ngram, d.min_ngram, d.match)
        return want
    return expected


@st.composite
def sizes(draw):
    lo = draw(st.integers(1, 4))
    return dict(min_ngram=lo, max_ngram=draw(st.integers(lo, lo + 4)))


batch_sizes = st.lists(st.integers(0, 9), min_size=1, max_size=8)
draft_sizes = st.lists(st.integers(0, 14), min_size=1, max_size=6)


@FAST
@given(alpha=alphabets(2, 6), data=st.data(), ngrams=sizes(), match=st.sampled_from(["first", "recent"]),
       n_draft=st.integers(0, 12), batches=batch_sizes, n_maxes=draft_sizes)
def test_random_streams_equal_the_rescan(alpha, data, ngrams, match, n_draft, batches, n_maxes):
    text = data.draw(streams(min_len=0, max_len=150, alphabet=alpha))
    d = PromptLookupDrafter(n_draft=n_draft, match=match, **ngrams)
    follow(d, text, data.draw(st.integers(0, len(text))), batches, n_maxes, by_rescan(d))


def test_confidence_is_the_matched_size():
    d = PromptLookupDrafter(max_ngram=4)
    rng = np.random.default_rng(0)
    text = rng.integers(0, 5, 400).astype(np.int32)
    d.reset(text[:10])
    for i in range(10, 400):
        size_of = d.proposal(6).confidence
        got = d.propose(6)
        want, size = prompt_lookup(text[:i].tolist(), 6, 4, 1, "first")
        assert got.tolist() == want and size_of == size
        d.accept(text[i : i + 1])


@needs_prose
@REAL
@given(offset=st.integers(0, 55000), length=st.integers(20, 1200), ngrams=sizes(),
       match=st.sampled_from(["first", "recent"]), batches=batch_sizes)
def test_real_text_equals_the_rescan(offset, length, ngrams, match, batches):
    d = PromptLookupDrafter(n_draft=10, match=match, **ngrams)
    follow(d, PROSE[offset : offset + length], 1, batches, [10, 3], by_rescan(d))


# --- llama-cpp-python's LlamaPromptLookupDecoding itself ---------------------------------

def _llama_pld(max_ngram: int, n_draft: int):
    spec = pytest.importorskip("llama_cpp.llama_speculative")
    peer = spec.LlamaPromptLookupDecoding(max_ngram_size=max_ngram, num_pred_tokens=n_draft)

    def expected(seq, n):
        assert n == n_draft  # the peer has one draft length
        return peer(np.asarray(seq, dtype=np.intc)).tolist()
    return expected


@FAST
@given(alpha=alphabets(2, 6), data=st.data(), max_ngram=st.integers(1, 5), n_draft=st.integers(1, 12),
       batches=batch_sizes)
def test_random_streams_equal_llama_cpp_python(alpha, data, max_ngram, n_draft, batches):
    text = data.draw(streams(min_len=1, max_len=150, alphabet=alpha))
    d = PromptLookupDrafter(max_ngram=max_ngram, min_ngram=1, n_draft=n_draft, match="first")
    follow(d, text, data.draw(st.integers(1, len(text))), batches, [n_draft], _llama_pld(max_ngram, n_draft))


@needs_prose
@REAL
@given(offset=st.integers(0, 55000), length=st.integers(200, 2000), max_ngram=st.integers(1, 4),
       n_draft=st.integers(1, 12), batches=batch_sizes)
def test_real_text_equals_llama_cpp_python(offset, length, max_ngram, n_draft, batches):
    d = PromptLookupDrafter(max_ngram=max_ngram, n_draft=n_draft)
    hits = follow(d, PROSE[offset : offset + length], 1, batches, [n_draft], _llama_pld(max_ngram, n_draft))
    assert hits > 0


@needs_prose
def test_defaults_equal_llama_cpp_python_on_a_long_stretch():
    # llama-cpp-python's defaults: max_ngram_size=2, num_pred_tokens=10
    d = PromptLookupDrafter(max_ngram=2, n_draft=10)
    hits = follow(d, PROSE[:5000], 1000, [1, 2, 5, 3], [10], _llama_pld(2, 10))
    assert hits > 500


# --- the rest ----------------------------------------------------------------------------

def test_match_rules_and_edges():
    d = PromptLookupDrafter(max_ngram=3, n_draft=4)
    d.reset([1, 2, 3, 4, 2, 3])
    assert d.propose().tolist() == [4, 2, 3]  # runs to the end of the sequence
    d.reset([5, 5, 5, 5])
    assert d.propose().tolist() == [5]  # the earlier "5 5 5" overlaps the suffix
    first, recent = PromptLookupDrafter(), PromptLookupDrafter(match="recent")
    for d in (first, recent):
        d.reset([7, 1, 7, 2, 7])
    assert first.propose(1).tolist() == [1] and recent.propose(1).tolist() == [2]
    d = PromptLookupDrafter(min_ngram=2)
    d.reset([7, 1, 7, 2, 7])
    assert d.propose().size == 0
    d.reset([])
    assert d.propose().size == 0
    assert PromptLookupDrafter._SOURCE is Source.COPY


def test_gate_and_stats():
    d = GatedDrafter(PromptLookupDrafter(n_draft=4), Gate([1.0, 1.1, 1.2, 1.3, 1.4]))
    d.reset([1, 2, 3, 4, 1, 2])
    p = d.propose()
    assert p.tolist() in ([3, 4, 1, 2][: p.size],)
    d.accept([3, 4, 9])
    assert d.stats.accepted == min(p.size, 2)
    assert "PromptLookupDrafter" in repr(d) and "Gate" in repr(d)


def test_replay_in_the_core_equals_a_python_loop():
    rng = np.random.default_rng(9)
    phrase = rng.integers(0, 200, 30)
    text = np.concatenate([np.concatenate([phrase, rng.integers(0, 200, 12)]) for _ in range(50)]).astype(np.int32)
    n_ctx, n_draft = 500, 6
    stats = replay_drafter(text, PromptLookupDrafter(n_draft=n_draft), n_ctx, n_draft)
    steps = drafted = accepted = 0
    for c in range((text.size - 1) // n_ctx):
        chunk = text[c * n_ctx : (c + 1) * n_ctx]
        have = 1
        while have < n_ctx:
            p, _ = prompt_lookup(chunk[:have].tolist(), n_draft)
            steps += 1
            drafted += len(p)
            acc = 0
            while acc < len(p) and have + acc < n_ctx and chunk[have + acc] == p[acc]:
                acc += 1
            accepted += acc
            have += min(acc + 1, n_ctx - have)
    assert (stats.n_steps, stats.n_drafted, stats.n_accept) == (steps, drafted, accepted)
    assert stats.n_accept > stats.n_steps


def test_bad_arguments():
    for kw in (dict(max_ngram=0), dict(min_ngram=0), dict(min_ngram=3, max_ngram=2), dict(max_ngram=65),
               dict(max_ngram=2.0), dict(n_draft=-1), dict(match="newest"), dict(min_ngram=True)):
        with pytest.raises(ValueError):
            PromptLookupDrafter(**kw)
    with pytest.raises(TypeError, match="match"):
        PromptLookupDrafter(match=1)
    with pytest.raises(TypeError, match="gate"):
        PromptLookupDrafter(gate=1.0)
    d = PromptLookupDrafter()
    with pytest.raises(ValueError, match="negative"):
        d.reset([3, -1])
    with pytest.raises(ValueError, match="n_max"):
        d.propose(-2)
