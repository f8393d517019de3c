"""Property tests: ngramcache agrees exactly with the pure-Python model (tests/reference.py).

Random streams use tiny vocabularies (2-6 symbols) so that n-grams repeat, parts get
several candidates, thresholds are hit from both sides and ties are frequent. The
symbols are arbitrary int32 ids (0 and INT32_MAX included) so nothing depends on
small ids. Real streams are slices of the PROSE vectors.

"Exactly" includes order: keys in insertion order and each part in first-seen order,
because that order decides ties when drafting and is what save() writes.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ngramcache as nc
import reference as ref

INT32_MAX = 2**31 - 1

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- helpers -----------------------------------------------------------------------

def as_list(cache) -> list:
    """A cache's full contents, order included: [(ngram, [(token, count), ...]), ...]."""
    return [(k, list(p.items())) for k, p in cache.items()]


def assert_same(ours: nc.NgramCache, model: dict) -> None:
    assert len(ours) == len(model)
    assert as_list(ours) == as_list(model)
    keys, offsets, toks, cnts = ours.arrays()
    assert keys.dtype == np.int32 and keys.shape == (len(model), 4)
    assert offsets.shape == (len(model) + 1,) and offsets[0] == 0
    exp_keys = np.array([ref.padded(k) for k in model], dtype=np.int32).reshape(-1, 4)
    np.testing.assert_array_equal(keys, exp_keys)
    np.testing.assert_array_equal(np.diff(offsets), [len(p) for p in model.values()])
    np.testing.assert_array_equal(toks, [t for p in model.values() for t in p])
    np.testing.assert_array_equal(cnts, [c for p in model.values() for c in p.values()])
    assert ours.to_bytes() == ref.to_bytes(model)


@st.composite
def alphabets(draw, min_size=2, max_size=6):
    """A small set of distinct token ids, extremes included now and then."""
    n = draw(st.integers(min_size, max_size))
    ids = st.one_of(st.integers(0, 9), st.integers(0, INT32_MAX), st.sampled_from([0, INT32_MAX]))
    return draw(st.lists(ids, min_size=n, max_size=n, unique=True))


@st.composite
def streams(draw, min_len=0, max_len=120, alphabet=None):
    alpha = alphabet if alphabet is not None else draw(alphabets())
    return draw(st.lists(st.sampled_from(alpha), min_size=min_len, max_size=max_len))


@st.composite
def size_ranges(draw):
    lo = draw(st.integers(1, 4))
    hi = draw(st.integers(lo, 4))
    return lo, hi


def build(tokens, ngram_min=1, ngram_max=4):
    ours, model = nc.NgramCache(), {}
    if tokens:
        ours.update(tokens, ngram_min, ngram_max)
        ref.update(model, tokens, ngram_min, ngram_max)
    return ours, model


# --- update, get, len, items, arrays -----------------------------------------------

@FAST
@given(tokens=streams(), sizes=size_ranges(), data=st.data())
def test_update_in_chunks_matches_reference(tokens, sizes, data):
    """Growing prefixes, each update adding the tokens new since the last one (bulk and
    single-token chunks mixed), plus nnew larger than the sequence."""
    lo, hi = sizes
    ours, model = nc.NgramCache(), {}
    n = 0
    while n < len(tokens):
        n_new = data.draw(st.integers(1, len(tokens) - n), label="chunk")
        n += n_new
        ours.update(tokens[:n], ngram_min=lo, ngram_max=hi, nnew=n_new)
        ref.update(model, tokens[:n], lo, hi, n_new)
    assert_same(ours, model)
    # nnew=None means the whole sequence; nnew beyond the length is the same.
    again, model2 = nc.NgramCache(), {}
    again.update(tokens, lo, hi, nnew=len(tokens) + 5)
    ref.update(model2, tokens, lo, hi)
    assert_same(again, model2)


@FAST
@given(tokens=streams(max_len=80), sizes=size_ranges())
def test_incremental_equals_bulk_contents(tokens, sizes):
    """nnew=1 per appended token, as the vectors' loop, counts what one bulk update counts
    (the key order differs: bulk goes size by size, incremental position by position)."""
    lo, hi = sizes
    inc, model = nc.NgramCache(), {}
    for i in range(1, len(tokens) + 1):
        inc.update(tokens[:i], lo, hi, nnew=1)
        ref.update(model, tokens[:i], lo, hi, 1)
    assert_same(inc, model)
    bulk, bulk_model = build(tokens, lo, hi)
    assert dict(inc.items()) == dict(bulk.items()) == bulk_model


@FAST
@given(tokens=streams(), sizes=size_ranges(), probe=st.lists(st.integers(0, INT32_MAX), min_size=1, max_size=4))
def test_get_matches_reference(tokens, sizes, probe):
    ours, model = build(tokens, *sizes)
    for key, part in model.items():
        got = ours.get(key)
        assert list(got.items()) == list(part.items())
        assert ours.get(np.array(key, dtype=np.int64)) == part  # any integer array works
    assert ours.get(probe) == model.get(tuple(probe), {})


@FAST
@given(tokens=streams(min_len=1), sizes=size_ranges())
def test_clear_empties(tokens, sizes):
    ours, _ = build(tokens, *sizes)
    ours.clear()
    assert len(ours) == 0 and list(ours.items()) == [] and ours.to_bytes() == b""
    ours.update(tokens, *sizes)
    assert_same(ours, build(tokens, *sizes)[1])


# --- draft -------------------------------------------------------------------------

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


@st.composite
def records(draw, alpha, sizes=(1, 2, 3, 4), max_count=INT32_MAX, max_records=25):
    """A lookup.bin image as a list of (key, [(token, count), ...]) with arbitrary pair
    order, and (sometimes) repeated keys and tokens."""
    out = []
    for _ in range(draw(st.integers(0, max_records))):
        n = draw(st.sampled_from(sizes))
        key = tuple(draw(st.lists(st.sampled_from(alpha), min_size=n, max_size=n)))
        pairs = draw(st.lists(st.tuples(st.sampled_from(alpha), st.integers(1, max_count)), min_size=1, max_size=6))
        out.append((key, pairs))
    return out


def image(recs) -> bytes:
    import struct
    b = bytearray()
    for key, pairs in recs:
        b += struct.pack("<5i", *ref.padded(key), len(pairs))
        for t, c in pairs:
            b += struct.pack("<2i", t, c)
    return bytes(b)


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


# --- merge -------------------------------------------------------------------------

@FAST
@given(data=st.data())
def test_merge_matches_reference(data):
    alpha = data.draw(alphabets(), label="alphabet")
    a = build(data.draw(streams(alphabet=alpha), label="a"), *data.draw(size_ranges(), label="a sizes"))
    b = build(data.draw(streams(alphabet=alpha), label="b"), *data.draw(size_ranges(), label="b sizes"))
    b_before = as_list(b[0])
    a[0].merge(b[0])
    ref.merge(a[1], b[1])
    assert_same(*a)
    assert as_list(b[0]) == b_before  # the added cache is not modified


@FAST
@given(tokens=streams(), sizes=size_ranges())
def test_merge_into_itself_doubles(tokens, sizes):
    ours, model = build(tokens, *sizes)
    ours.merge(ours)
    ref.merge(model, model)
    assert_same(ours, model)
    assert all(c % 2 == 0 for _, p in model.items() for c in p.values())


@FAST
@given(data=st.data())
def test_merge_into_empty_copies(data):
    src = build(data.draw(streams(), label="src"), *data.draw(size_ranges(), label="sizes"))
    dst = nc.NgramCache()
    dst.merge(src[0])
    assert as_list(dst) == as_list(src[1])


# --- save / load -------------------------------------------------------------------

@SLOW
@given(tokens=streams(), sizes=size_ranges())
def test_save_load_roundtrip(tokens, sizes):
    ours, model = build(tokens, *sizes)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "cache.bin")
        ours.save(path)
        with open(path, "rb") as f:
            data = f.read()
        assert data == ref.to_bytes(model)
        loaded = nc.NgramCache.load(path)
        assert os.listdir(d) == ["cache.bin"]  # no temporary file left behind
    assert_same(loaded, model)  # same order too: records and pairs were written in order
    assert_same(nc.NgramCache.from_bytes(data), ref.from_bytes(data))


@FAST
@given(data=st.data())
def test_load_keeps_file_order_and_first_duplicates(data):
    alpha = data.draw(alphabets(), label="alphabet")
    img = image(data.draw(records(alpha), label="records"))
    ours, model = nc.NgramCache.from_bytes(img), ref.from_bytes(img)
    assert_same(ours, model)
    # A second save of a loaded cache reproduces a duplicate-free file exactly.
    assert nc.NgramCache.from_bytes(ours.to_bytes()).to_bytes() == ours.to_bytes()


@FAST
@given(data=st.data())
def test_canonical_form_independent_of_order(data):
    """Bulk and incremental builds of the same stream differ in order but not in contents."""
    tokens = data.draw(streams(), label="tokens")
    bulk = build(tokens)[0]
    inc = nc.NgramCache()
    for i in range(2, len(tokens) + 1):
        inc.update(tokens[:i], nnew=1)
    assert ref.canonical_bytes(ref.from_bytes(bulk.to_bytes())) == ref.canonical_bytes(ref.from_bytes(inc.to_bytes()))


# --- real token streams ------------------------------------------------------------

@pytest.fixture(scope="module")
def prose(vectors_dir):
    return np.fromfile(vectors_dir / "prose.tokens.i32", dtype="<i4").astype(np.int32)


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


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.integers(0, 50000), b=st.integers(0, 50000), n=st.integers(1, 8000))
def test_real_stream_merge_and_roundtrip(prose, a, b, n):
    x, y = build(prose[a:a + n].tolist()), build(prose[b:b + n].tolist(), 2, 3)
    x[0].merge(y[0])
    ref.merge(x[1], y[1])
    assert_same(*x)
    assert_same(nc.NgramCache.from_bytes(x[0].to_bytes()), x[1])


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
