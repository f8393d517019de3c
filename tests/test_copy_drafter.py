"""CopyDrafter (compiled core) against the plain-Python ReferenceCopyDrafter: the same
proposal, confidence and gate source at every step, on random streams and on real text,
with and without dynamic and static caches, accept batches of random sizes; the context
cache, the index, save_dynamic, gated runs, the C++ replay, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ngramcache as nc
from conftest import FAST, VECTORS, alphabets, streams
from ngramcache import CopyDrafter, NgramCache, StaticTable
from ngramcache.decoding.gate import Gate, GatedDrafter
from ngramcache.replays import replay_drafter
from reference_copy import ReferenceCopyDrafter

REAL = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _prose() -> np.ndarray | None:
    if VECTORS is None:
        return None
    return np.fromfile(VECTORS / "prose.tokens.i32", dtype="<i4").astype(np.int32)


PROSE = _prose()
needs_prose = pytest.mark.skipif(PROSE is None, reason="reference vectors not found (set NGRAMCACHE_VECTORS)")


def as_map(cache: NgramCache) -> dict:
    return {k: list(v.items()) for k, v in cache.items()}


def follow(ours: CopyDrafter, ref: ReferenceCopyDrafter, text, start: int, batches, n_maxes) -> int:
    """Feeds both drafters the same text and compares every proposal; returns the steps
    on which the copy (not the lookup) proposed."""
    text = np.asarray(text, dtype=np.int32)
    if not any(batches):  # an empty accept now and then, but the text must advance
        batches = [*batches, 1]
    ours.reset(text[:start])
    ref.reset(text[:start])
    have, step, copies = start, 0, 0
    while True:
        n_max = n_maxes[step % len(n_maxes)]
        step_of = ours.proposal(n_max)  # one call: the proposal, its confidence and its source
        got, want = ours.propose(n_max), ref.propose(n_max)
        where = f"step {step}, {have} tokens, n_max {n_max}"
        assert got.tolist() == want.tolist() == step_of.tokens.tolist(), where
        if want.size:
            assert step_of.confidence == ref.last_confidence, where
            assert step_of.source is ref.last_source, where
            copies += int(ref.last_source)
        if have == text.size:
            return copies
        k = min(text.size - have, batches[step % len(batches)])
        ours.accept(text[have : have + k])
        ref.accept(text[have : have + k])
        have += k
        step += 1


@st.composite
def copy_options(draw):
    lo = draw(st.integers(1, 4))
    ngram_min = draw(st.integers(1, 4))
    return dict(min_match=lo, max_match=draw(st.integers(lo, lo + 8)), max_candidates=draw(st.integers(1, 6)),
                ngram_min=ngram_min, ngram_max=draw(st.integers(ngram_min, 4)))


batch_sizes = st.lists(st.integers(0, 9), min_size=1, max_size=8)
draft_sizes = st.lists(st.integers(0, 20), min_size=1, max_size=6)


@FAST
@given(alpha=alphabets(2, 5), data=st.data(), opts=copy_options(), batches=batch_sizes, n_maxes=draft_sizes)
def test_random_streams_propose_as_the_reference(alpha, data, opts, batches, n_maxes):
    text = data.draw(streams(min_len=0, max_len=160, alphabet=alpha))
    start = data.draw(st.integers(0, len(text)))
    follow(CopyDrafter(n_draft=16, **opts), ReferenceCopyDrafter(n_draft=16, **opts), text, start, batches, n_maxes)


@FAST
@given(alpha=alphabets(2, 4), data=st.data(), opts=copy_options(), batches=batch_sizes, n_maxes=draft_sizes,
       kinds=st.sampled_from(["dynamic", "static-cache", "static-table", "both"]))
def test_random_streams_with_dynamic_and_static(alpha, data, opts, batches, n_maxes, kinds):
    corpus = np.asarray(data.draw(streams(min_len=20, max_len=300, alphabet=alpha)), dtype=np.int32)
    text = data.draw(streams(min_len=1, max_len=120, alphabet=alpha))
    caches = {}
    if kinds in ("dynamic", "both"):
        caches["dynamic"] = NgramCache()
        caches["dynamic"].update(corpus[: corpus.size // 2], 1, 4)
    if kinds in ("static-cache", "both"):
        caches["static"] = NgramCache()
        caches["static"].update(corpus, 2, 2)
    if kinds == "static-table":
        caches["static"] = StaticTable.build(corpus, 2)
    follow(CopyDrafter(n_draft=12, **opts, **caches), ReferenceCopyDrafter(n_draft=12, **opts, **caches),
           text, data.draw(st.integers(0, len(text))), batches, n_maxes)


@needs_prose
@REAL
@given(offset=st.integers(0, 50000), length=st.integers(50, 1500), opts=copy_options(), batches=batch_sizes,
       n_maxes=draft_sizes, with_caches=st.booleans())
def test_real_text_proposes_as_the_reference(offset, length, opts, batches, n_maxes, with_caches):
    text = PROSE[offset : offset + length]
    caches = {}
    if with_caches:
        other = PROSE[(offset + 20000) % 40000 :][:8000]
        caches["dynamic"] = NgramCache()
        caches["dynamic"].update(other[:4000])
        caches["static"] = StaticTable.build(other, 2)
    follow(CopyDrafter(n_draft=16, **opts, **caches), ReferenceCopyDrafter(n_draft=16, **opts, **caches),
           text, min(100, text.size), batches, n_maxes)


@needs_prose
def test_real_text_copies_and_looks_up():
    # the default settings over a long stretch: both sources are exercised and agree
    copies = follow(CopyDrafter(), ReferenceCopyDrafter(), PROSE[:6000], 500, [1, 3, 2, 5, 1, 8], [16])
    assert copies > 50


@needs_prose
def test_gated_runs_agree():
    costs = [1.0, 1.3, 1.5, 1.8, 2.0, 2.4, 2.7, 3.0, 3.3]
    ours = GatedDrafter(CopyDrafter(n_draft=8), Gate(costs))
    ref = GatedDrafter(ReferenceCopyDrafter(n_draft=8), Gate(costs))
    text = PROSE[10000:14000]
    ours.reset(text[:200])
    ref.reset(text[:200])
    have = 200
    while have < text.size:
        got, want = ours.propose(8), ref.propose(8)
        assert got.tolist() == want.tolist(), have
        acc = 0
        while acc < got.size and have + acc < text.size and text[have + acc] == got[acc]:
            acc += 1
        new = text[have : have + acc + 1]
        ours.accept(new)
        ref.accept(new)
        have += new.size
    assert ours.stats.drafted == ref.stats.drafted and ours.stats.accepted == ref.stats.accepted
    assert ours.stats.skipped == ref.stats.skipped > 0


def test_context_and_index_follow_the_sequence():
    rng = np.random.default_rng(3)
    text = rng.integers(0, 6, 3000).astype(np.int32)
    ours, ref = CopyDrafter(min_match=3), ReferenceCopyDrafter(min_match=3)
    follow(ours, ref, text, 40, [1, 4, 2, 7], [5])
    assert as_map(ours.context) == as_map(ref.context)
    assert ours._index == ref._index
    full = NgramCache()
    full.update(text)
    assert as_map(ours.context) == as_map(full)


def test_save_dynamic_and_then_draft_from_it(tmp_path):
    rng = np.random.default_rng(8)
    text = rng.integers(0, 40, 2000).astype(np.int32)
    for dynamic in (None, "given"):
        blob = None
        if dynamic:
            d = NgramCache()
            d.update(text[1000:])
            blob = d.to_bytes()
        # Both sides load the same file: a load keeps the file's order, which decides the
        # order of the merged file (a second save-and-load would reorder it, as llama.cpp's).
        ours = CopyDrafter(**({"dynamic": NgramCache.from_bytes(blob)} if blob else {}))
        ref = ReferenceCopyDrafter(**({"dynamic": NgramCache.from_bytes(blob)} if blob else {}))
        follow(ours, ref, text[:600], 100, [3], [8])
        a = ours.save_dynamic(tmp_path / "ours.bin")
        b = ref.save_dynamic(tmp_path / "ref.bin")
        assert (tmp_path / "ours.bin").read_bytes() == (tmp_path / "ref.bin").read_bytes()
        assert ours.dynamic is a and a.to_bytes() == b.to_bytes()
        # the dynamic cache made by save_dynamic is drafted from afterwards, as before
        ours.reset(text[600:601])
        ref.reset(text[600:601])
        follow(ours, ref, text[600:1000], 1, [2, 1], [8])


def test_dynamic_can_be_replaced():
    rng = np.random.default_rng(1)
    corpus = rng.integers(0, 4, 3000).astype(np.int32)
    dyn = NgramCache()
    dyn.update(corpus)
    ours, ref = CopyDrafter(min_match=4), ReferenceCopyDrafter(min_match=4)
    ours.dynamic = dyn
    ref.dynamic = dyn
    follow(ours, ref, rng.integers(0, 4, 300).astype(np.int32), 1, [1, 2], [6])
    with pytest.raises(TypeError, match="dynamic"):
        ours.dynamic = {}


def test_replay_in_the_core_equals_a_python_loop():
    rng = np.random.default_rng(5)
    phrase = rng.integers(0, 300, 60)
    text = np.concatenate([np.concatenate([phrase, rng.integers(0, 300, 15)]) for _ in range(40)]).astype(np.int32)
    n_ctx, n_draft = 700, 8
    stats = replay_drafter(text, CopyDrafter(), n_ctx, n_draft)
    ref = ReferenceCopyDrafter(n_draft=n_draft)
    drafted = accepted = steps = 0
    for c in range((text.size - 1) // n_ctx):
        chunk = text[c * n_ctx : (c + 1) * n_ctx]
        ref.reset(chunk[:1])
        have = 1
        while have < n_ctx:
            p = ref.propose(n_draft)
            steps += 1
            drafted += p.size
            acc = 0
            while acc < p.size and have + acc < n_ctx and chunk[have + acc] == p[acc]:
                acc += 1
            accepted += acc
            n_new = min(acc + 1, n_ctx - have)
            ref.accept(chunk[have : have + n_new])
            have += n_new
    assert (stats.n_steps, stats.n_drafted, stats.n_accept) == (steps, drafted, accepted)
    assert stats.n_accept > stats.n_steps


def test_bad_arguments():
    for kw in (dict(min_match=0), dict(max_match=0), dict(min_match=5, max_match=4), dict(max_candidates=0),
               dict(min_match=1.5), dict(max_candidates=True), dict(n_draft=-1), dict(ngram_min=0),
               dict(ngram_min=3, ngram_max=2), dict(ngram_max=5)):
        with pytest.raises(ValueError):
            CopyDrafter(**kw)
    with pytest.raises(TypeError, match="dynamic"):
        CopyDrafter(dynamic={})
    with pytest.raises(TypeError, match="static"):
        CopyDrafter(static=[1, 2])
    d = CopyDrafter()
    with pytest.raises(ValueError, match="negative"):
        d.reset([1, -2])
    with pytest.raises(ValueError):
        d.accept([1.5])
    with pytest.raises(ValueError, match="n_max"):
        d.propose(-1)
    # a static table of other than 2-grams, which drafting cannot read, is refused when given
    for size in (1, 3, 4):
        with pytest.raises(ValueError, match=f"static must be a table of 2-grams.*holds {size}-grams"):
            CopyDrafter(static=StaticTable.build(np.arange(50, dtype=np.int32) % 7, size))
    d = CopyDrafter(static=StaticTable.build(np.arange(50, dtype=np.int32) % 7, 2))
    d.reset([1, 2, 3])
    assert d.propose(4).size > 0


def test_is_a_core_drafter():
    d = CopyDrafter()
    assert isinstance(d, nc.drafters.CoreSequenceDrafter) and isinstance(d, nc.Drafter)
    d.reset([1, 2, 1, 2])
    assert "CopyDrafter" in repr(d) and d.propose(4).tolist() == [1, 2]
