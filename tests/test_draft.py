"""draft(): exactly the pure-Python model's drafts (tests/reference.py) from the context,
dynamic and static caches, on random and real streams; its argument errors.

Random streams use tiny vocabularies so that thresholds are hit from both sides and ties
are frequent; real streams are slices of the PROSE, DYNPUB and small-static vectors.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ngramcache as nc
import reference as ref
from ngramcache import NgramCache
from conftest import FAST, INT32_MAX, SLOW, alphabets, assert_same, build, image, records, size_ranges, streams


# --- arguments -------------------------------------------------------------------------

@pytest.mark.parametrize("n", [-1, -100, np.int64(-3)])
def test_negative_n_draft(cache, n):
    with pytest.raises(ValueError, match="n_draft"):
        nc.draft([1, 2], n, cache)


@pytest.mark.parametrize("n", [1.0, 2.5, True, "3", None])
def test_non_integer_n_draft(cache, n):
    with pytest.raises(ValueError, match="n_draft"):
        nc.draft([1, 2], n, cache)


def test_zero_n_draft_drafts_nothing(cache):
    assert nc.draft([1, 2], 0, cache).tolist() == []


def test_wrong_cache_types(cache):
    with pytest.raises(TypeError, match="NgramCache"):
        cache.merge({(1,): {2: 1}})
    with pytest.raises(TypeError, match="context"):
        nc.draft([1, 2], 3, None)
    with pytest.raises(TypeError, match="dynamic"):
        nc.draft([1, 2], 3, cache, dynamic=5)
    with pytest.raises(TypeError, match="static"):
        nc.draft([1, 2], 3, cache, static="x")


# --- against the reference model -------------------------------------------------------

def replay(tokens, n_draft, ngram_min, ngram_max, dynamic=None, static=None, update_sizes=(1, 4)):
    """The vectors' loop over `tokens` for ours and the model side by side; returns the
    number of positions compared and fails on the first differing draft."""
    ours_dyn, model_dyn = dynamic if dynamic is not None else (None, None)
    ours_st, model_st = static if static is not None else (None, None)
    ctx, model = nc.NgramCache(), {}
    arr = np.asarray(tokens, dtype=np.int32)
    lo, hi = update_sizes
    for pos in range(1, len(tokens) + 1):
        if pos >= 2:
            ctx.update(arr[:pos], lo, hi, nnew=1)
            ref.update(model, tokens[:pos], lo, hi, 1)
        got = nc.draft(arr[:pos], n_draft, ctx, ours_dyn, ours_st, ngram_min, ngram_max)
        want = ref.draft(tokens[:pos], n_draft, model, model_dyn, model_st, ngram_min, ngram_max)
        assert got.dtype == np.int32
        assert got.tolist() == want, f"pos {pos}"
        assert len(got) <= n_draft
    assert_same(ctx, model)
    return len(tokens)


@FAST
@given(tokens=streams(max_len=100), n_draft=st.integers(0, 10), sizes=size_ranges())
def test_draft_context_only(tokens, n_draft, sizes):
    replay(tokens, n_draft, *sizes)


@FAST
@given(tokens=streams(max_len=60), n_draft=st.integers(0, 10), sizes=size_ranges(),
       upd=size_ranges())
def test_draft_sizes_differ_from_update_sizes(tokens, n_draft, sizes, upd):
    """Drafting with n-gram sizes the cache was not built with (keys simply absent)."""
    replay(tokens, n_draft, *sizes, update_sizes=upd)


@SLOW
@given(data=st.data(), n_draft=st.integers(0, 10), sizes=size_ranges())
def test_draft_with_dynamic(data, n_draft, sizes):
    alpha = data.draw(alphabets(), label="alphabet")
    tokens = data.draw(streams(max_len=80, alphabet=alpha), label="tokens")
    dyn_tokens = data.draw(streams(max_len=150, alphabet=alpha), label="dynamic")
    dyn = build(dyn_tokens)
    replay(tokens, n_draft, *sizes, dynamic=dyn)


@SLOW
@given(data=st.data(), n_draft=st.integers(0, 10), sizes=size_ranges(), with_dynamic=st.booleans())
def test_draft_with_static(data, n_draft, sizes, with_dynamic):
    """Static re-ranking (score ties between different counts included) and static-only steps."""
    alpha = data.draw(alphabets(), label="alphabet")
    tokens = data.draw(streams(max_len=80, alphabet=alpha), label="tokens")
    static = build(data.draw(streams(max_len=200, alphabet=alpha), label="static"), 2, 2)
    dyn = build(data.draw(streams(max_len=150, alphabet=alpha), label="dynamic")) if with_dynamic else None
    replay(tokens, n_draft, *sizes, dynamic=dyn, static=static)


@SLOW
@given(data=st.data(), n_draft=st.integers(1, 8))
def test_draft_any_cache_as_static(data, n_draft):
    """A cache with keys of every size as the static cache: only its 2-grams count."""
    alpha = data.draw(alphabets(), label="alphabet")
    tokens = data.draw(streams(max_len=60, alphabet=alpha), label="tokens")
    static = build(data.draw(streams(max_len=120, alphabet=alpha), label="static"))
    replay(tokens, n_draft, 1, 4, static=static)


@SLOW
@given(data=st.data(), n_draft=st.integers(1, 8), sizes=size_ranges())
def test_draft_with_loaded_caches_and_huge_counts(data, n_draft, sizes):
    """Dynamic and static caches read from files whose counts go up to INT32_MAX: products
    that overflow int32 in llama.cpp must be exact here, and file order is first-seen order."""
    alpha = data.draw(alphabets(max_size=4), label="alphabet")
    big = st.sampled_from([1, 2, 3, 1000, 2**20, 2**30, INT32_MAX])
    tokens = data.draw(streams(max_len=60, alphabet=alpha), label="tokens")
    dyn_img = image(data.draw(records(alpha), label="dynamic"))
    st_recs = [(k, [(t, data.draw(big)) for t, _ in p]) for k, p in data.draw(records(alpha, sizes=(2,)), label="static")]
    st_img = image(st_recs)
    dyn = (nc.NgramCache.from_bytes(dyn_img), ref.from_bytes(dyn_img))
    stat = (nc.NgramCache.from_bytes(st_img), ref.from_bytes(st_img))
    assert_same(*dyn)
    assert_same(*stat)
    replay(tokens, n_draft, *sizes, dynamic=dyn, static=stat)


@SLOW
@given(data=st.data(), n_draft=st.integers(0, 8), sizes=size_ranges())
def test_draft_from_arbitrary_sequences(data, n_draft, sizes):
    """draft() on sequences unrelated to how the caches were built (not just prefixes
    of the context stream), including sequences of length 0-3."""
    alpha = data.draw(alphabets(), label="alphabet")
    ctx = build(data.draw(streams(max_len=100, alphabet=alpha), label="context"))
    dyn = build(data.draw(streams(max_len=100, alphabet=alpha), label="dynamic"))
    stat = build(data.draw(streams(max_len=100, alphabet=alpha), label="static"), 2, 2)
    for _ in range(10):
        seq = data.draw(streams(max_len=6, alphabet=alpha), label="seq")
        got = nc.draft(seq, n_draft, ctx[0], dyn[0], stat[0], *sizes)
        assert got.tolist() == ref.draft(seq, n_draft, ctx[1], dyn[1], stat[1], *sizes)


# --- real token streams ----------------------------------------------------------------

@pytest.fixture(scope="module")
def dynpub(vectors_dir):
    toks = np.fromfile(vectors_dir / "dynpub.tokens.i32", dtype="<i4").astype(np.int32)
    return build(toks[:20000].tolist())


@pytest.fixture(scope="module")
def static_small(vectors_dir):
    toks = np.fromfile(vectors_dir / "small-static.tokens.i32", dtype="<i4").astype(np.int32)
    return build(toks[:40000].tolist(), 2, 2)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(0, 58000), length=st.integers(200, 2000), n_draft=st.integers(1, 10))
def test_real_stream_context_only(prose, start, length, n_draft):
    replay(prose[start:start + length].tolist(), n_draft, 1, 4)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(0, 58000), length=st.integers(200, 1500), n_draft=st.integers(1, 10),
       sizes=size_ranges())
def test_real_stream_full(prose, dynpub, static_small, start, length, n_draft, sizes):
    replay(prose[start:start + length].tolist(), n_draft, *sizes, dynamic=dynpub, static=static_small)


# --- the oracle itself -----------------------------------------------------------------

def test_hypothesis_streams_hit_ties_and_thresholds():
    """Guard against a vacuous oracle: small alphabets really produce passing ties,
    failing thresholds and every drafting source."""
    rng = np.random.default_rng(7)
    toks = rng.integers(0, 3, 300).tolist()
    ctx = {}
    ties = fails = drafted = 0
    for pos in range(2, len(toks) + 1):
        ref.update(ctx, toks[:pos], 1, 4, 1)
        for size in range(1, 5):
            part = ctx.get(tuple(toks[pos - size:pos]))
            if not part:
                continue
            counts = sorted(part.values(), reverse=True)
            total = sum(counts)
            if len(counts) > 1 and counts[0] == counts[1] and 100 * counts[0] >= ref.MIN_PERCENT_LAX[size - 1] * total:
                ties += 1
            if 100 * counts[0] < ref.MIN_PERCENT_LAX[size - 1] * total:
                fails += 1
        drafted += len(ref.draft(toks[:pos], 4, ctx))
    assert ties > 10 and fails > 10 and drafted > 100


def test_checked_paths_equal_the_public_ones(prose):
    """The drafters' per-step calls (arguments validated once, up front) give exactly what
    the public draft() and update() give."""
    from ngramcache.draft import draft_checked

    tokens = np.asarray(prose[:3000], dtype=np.int32)
    a, b = NgramCache(), NgramCache()
    for i in range(1, tokens.size + 1):
        a.update(tokens[:i], 1, 4, nnew=1)
        b.update_checked(tokens[:i], 1, 4, 1)
        if i % 7 == 0:
            assert draft_checked(tokens[:i], 8, b, None, None, 1, 4).tolist() == nc.draft(tokens[:i], 8, a).tolist()
    assert a.arrays()[0].tolist() == b.arrays()[0].tolist()
    assert [x.tolist() for x in a.arrays()] == [x.tolist() for x in b.arrays()]
