"""The drafters: LookupDrafter (incremental llama.cpp lookup drafting), CopyDrafter and
OracleDrafter, and the Drafter protocol."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import pytest

import ngramcache as nc
from ngramcache import Drafter, LookupDrafter, NgramCache, OracleDrafter
from ngramcache.drafters.base import _TokenBuffer

from conftest import canonical_bytes


def stdlib_tokens(n: int) -> np.ndarray:
    """Real text as token ids: bytes of a stdlib source file (a byte-level 'tokenizer')."""
    path = Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py"
    data = path.read_bytes()[: n]
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)


# --- LookupDrafter ---------------------------------------------------------------------

def test_protocol():
    assert isinstance(LookupDrafter(), Drafter)
    assert isinstance(OracleDrafter([1, 2]), Drafter)
    assert not isinstance(object(), Drafter)


def test_proposals_equal_draft_on_the_whole_sequence():
    toks = stdlib_tokens(6000)
    dyn = NgramCache()
    dyn.update(stdlib_tokens(20000)[10000:])
    static = NgramCache()
    static.update(stdlib_tokens(20000), 2, 2)
    for kw in (dict(), dict(dynamic=dyn), dict(dynamic=dyn, static=static), dict(ngram_min=2, ngram_max=3)):
        d = LookupDrafter(n_draft=6, **kw)
        d.reset(toks[:300])
        ctx = NgramCache()
        ctx.update(toks[:300], kw.get("ngram_min", 1), kw.get("ngram_max", 4))
        n = 300
        step = 0
        while n < 3000:
            got = d.propose(6)
            want = nc.draft(toks[:n], 6, ctx, dynamic=kw.get("dynamic"), static=kw.get("static"),
                            ngram_min=kw.get("ngram_min", 1), ngram_max=kw.get("ngram_max", 4))
            assert got.tolist() == want.tolist(), (kw, n)
            k = 1 + step % 5  # accept a varying number of tokens per step
            d.accept(toks[n : n + k])
            ctx.update(toks[: n + k], kw.get("ngram_min", 1), kw.get("ngram_max", 4), nnew=k)
            n += k
            step += 1
        assert d.tokens.tolist() == toks[:n].tolist()
        # the incrementally kept context cache equals one built in one go (same
        # continuations in the same first-seen order; keys may be stored in another order)
        full = NgramCache()
        full.update(toks[:n], kw.get("ngram_min", 1), kw.get("ngram_max", 4))
        as_map = lambda c: {k: list(v.items()) for k, v in c.items()}  # noqa: E731
        assert as_map(d.context) == as_map(full)


def test_stats_count_drafted_and_accepted():
    d = LookupDrafter(n_draft=4)
    d.reset([1, 2, 3, 1, 2, 3, 1, 2])
    p = d.propose(4)
    assert p.tolist() == [3, 1, 2, 3]
    d.accept([3, 1, 9])  # two right, then the model's own token
    assert d.stats.drafted == 4 and d.stats.accepted == 2 and d.stats.proposals == 1
    d.accept([5])  # no proposal in between: nothing counted
    assert d.stats.accepted == 2
    assert d.propose(0).size == 0
    with pytest.raises(ValueError, match="n_max"):
        d.propose(-1)
    d.reset([4])
    assert d.stats.drafted == 0


def test_accept_adds_only_the_ngrams_of_the_new_tokens():
    # an accept updates the context cache in place, with the n-grams that end in the new
    # tokens: an n-gram put there by hand survives it (nothing is rebuilt), and every other
    # count equals a cache built from the whole sequence in one go (nothing counted twice)
    toks = stdlib_tokens(5000)
    d = LookupDrafter()
    d.reset(toks[:4000])
    d.context.update([900, 901, 902], 2, 2)
    d.accept(toks[4000:4003])
    d.accept(toks[4003:4004])
    full = NgramCache()
    full.update(toks[:4004])
    full.update([900, 901, 902], 2, 2)
    as_map = lambda c: {k: list(v.items()) for k, v in c.items()}  # noqa: E731
    assert as_map(d.context) == as_map(full)
    assert d.context.get([900, 901]) == {902: 1}


def test_buffer_growth():
    b = _TokenBuffer(16)
    ref = []
    for i in range(200):
        chunk = np.arange(i % 7, dtype=np.int32) + i
        b.extend(chunk)
        ref.extend(chunk.tolist())
    assert b.view().tolist() == ref


def test_save_dynamic_like_lookup_lcd(tmp_path):
    toks = stdlib_tokens(4000)
    dyn = NgramCache()
    dyn.update(toks[:1000])
    d = LookupDrafter(dynamic=dyn)
    d.reset(toks[1000:2000])
    d.accept(toks[2000:2100])
    out = tmp_path / "lookup-dynamic.bin"
    merged = d.save_dynamic(out)
    want = NgramCache()
    want.update(toks[:1000])
    ctx = NgramCache()  # built the way llama-lookup builds it: prompt, then each new batch
    ctx.update(toks[1000:2000])
    ctx.update(toks[1000:2100], nnew=100)
    want.merge(ctx)
    assert out.read_bytes() == want.to_bytes() == merged.to_bytes()
    # Loading keeps the contents; its order is that of a map filled from the file, as
    # llama.cpp's loader fills one, so saving it again may order the records differently.
    loaded = NgramCache.load(out)
    assert canonical_bytes(loaded) == canonical_bytes(merged)
    # without a dynamic cache one is created
    d2 = LookupDrafter()
    d2.reset(toks[:50])
    d2.save_dynamic(tmp_path / "new.bin")
    assert (tmp_path / "new.bin").read_bytes() == d2.dynamic.to_bytes()
    assert canonical_bytes(NgramCache.load(tmp_path / "new.bin")) == canonical_bytes(d2.context)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_draft"):
        LookupDrafter(n_draft=-1)
    with pytest.raises(ValueError, match="ngram"):
        LookupDrafter(ngram_min=3, ngram_max=2)
    with pytest.raises(TypeError, match="dynamic"):
        LookupDrafter(dynamic={})
    with pytest.raises(TypeError, match="gate"):
        LookupDrafter(gate=[1.0])  # a drafter takes no gate: the gate wraps it
    with pytest.raises(TypeError, match="static"):
        LookupDrafter(static={(1, 2): {3: 1}})
    with pytest.raises(ValueError, match="negative"):
        LookupDrafter().reset([1, -2])
    with pytest.raises(ValueError):
        LookupDrafter().accept([1.5])


def test_a_static_table_drafting_cannot_read_is_refused_when_given():
    tokens = np.arange(60, dtype=np.int32) % 9
    for size in (1, 3, 4):
        with pytest.raises(ValueError, match=f"static must be a table of 2-grams.*holds {size}-grams"):
            LookupDrafter(static=nc.StaticTable.build(tokens, size))
    d = LookupDrafter(static=nc.StaticTable.build(tokens, 2))
    d.reset([1, 2, 3])
    assert d.propose(4).tolist() == nc.draft([1, 2, 3], 4, d.context, static=d.static).tolist()


def test_one_bound_on_n_draft_for_drafting_and_every_drafter():
    from ngramcache.draft import MAX_DRAFT
    from ngramcache.drafters.catalog import DRAFTERS, make_drafter

    assert nc.drafters.MAX_DRAFT == MAX_DRAFT == 1 << 20
    with pytest.raises(ValueError, match=f"n_draft must be <= {MAX_DRAFT}"):
        nc.draft([1, 2], MAX_DRAFT + 1, NgramCache())
    for name in DRAFTERS:
        assert make_drafter(name, n_draft=MAX_DRAFT).n_draft == MAX_DRAFT
        with pytest.raises(ValueError, match=f"n_draft must be 0 to {MAX_DRAFT}, got {2**40}"):
            make_drafter(name, n_draft=2**40)
    with pytest.raises(ValueError, match="n_draft must be 0 to"):
        OracleDrafter([1, 2], n_draft=MAX_DRAFT + 1)


# --- the sequence a drafter holds ------------------------------------------------------

def _follow(d, text, rng, prompts=(0, 1, 300), until=2600):
    """Feeds ``d`` random batches of ``text`` after each prompt length, checking ``tokens``
    against the tokens fed; returns some of the views taken, each with what it showed."""
    kept = []
    for n_prompt in prompts:
        d.reset(text[:n_prompt])
        fed = text[:n_prompt].tolist()
        assert d.tokens.tolist() == fed
        have, step = n_prompt, 0
        while have < until:  # far past any first capacity: the sequence grows many times
            d.propose()
            k = int(rng.integers(1, 10))
            d.accept(text[have : have + k])
            fed += text[have : have + k].tolist()
            have += k
            step += 1
            if step % 37 == 0:
                view = d.tokens
                assert view.tolist() == fed
                kept.append((view, list(fed)))
        assert d.tokens.tolist() == fed
    return kept


@pytest.mark.parametrize("name", [s.name for s in nc.drafters.registry.specs()])
def test_tokens_is_the_sequence_in_place_and_keeps_what_it_showed(name):
    # every registered drafter: tokens equals the tokens fed through reset and accept, and a
    # view taken earlier still shows what it showed after later accepts (growth included)
    # and resets; a compiled drafter's view is its own buffer read in place (no copy): two
    # reads share memory, and the view neither owns it nor lets it be written
    rng = np.random.default_rng(7)
    text = rng.integers(0, 30, 3000).astype(np.int32)
    d = nc.drafters.registry.make_drafter(name, n_draft=8)
    for view, showed in _follow(d, text, rng):
        assert view.tolist() == showed
    a, b = d.tokens, d.tokens
    assert np.shares_memory(a, b)
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1
    if isinstance(d, nc.drafters.CoreSequenceDrafter):
        assert not a.flags.owndata and not isinstance(a.base, np.ndarray)
        with pytest.raises(ValueError):
            a.flags.writeable = True
        del d  # the view keeps the memory it shows
        assert a.size >= 2600 and a.tolist() == b.tolist() == text[: a.size].tolist()


def test_a_python_drafter_keeps_what_its_views_showed():
    rng = np.random.default_rng(8)
    text = rng.integers(0, 30, 3000).astype(np.int32)
    for view, showed in _follow(OracleDrafter(text[300:]), text, rng):
        assert view.tolist() == showed
        assert not view.flags.writeable


def test_an_empty_sequence_reads_as_an_empty_array():
    for d in (LookupDrafter(), nc.drafters.registry.make_drafter("simple"), OracleDrafter([1])):
        assert d.tokens.size == 0 and d.tokens.dtype == np.int32
        d.reset([])
        assert d.tokens.size == 0
        d.accept([4, 5])
        assert d.tokens.tolist() == [4, 5]


# --- OracleDrafter ---------------------------------------------------------------------

def test_oracle():
    o = OracleDrafter([5, 6, 7, 8, 9], n_draft=3)
    o.reset([1, 2])
    o.accept([5])
    assert o.propose(10).tolist() == [6, 7, 8]
    o.accept([6, 7, 8])
    assert o.stats.accepted == 3
    assert o.propose(2).tolist() == [9]
    o.accept([1])  # the text departs from the continuation: nothing more to propose
    assert o.propose(2).size == 0


# --- CopyDrafter -----------------------------------------------------------------------

def test_copy_drafter_continues_the_longest_earlier_match():
    #          0  1  2  3  4  5  6  7  8  9 10 11 12 13
    seq = [1, 2, 3, 9, 9, 5, 2, 3, 7, 7, 8, 0, 5, 2, 3]
    d = nc.CopyDrafter(n_draft=3)
    d.reset(seq)
    # "2 3" occurs after 1 (pos 2) and after 5 (pos 7); "5 2 3" matches pos 7 longer
    assert d.propose(3).tolist() == [7, 7, 8]
    d.accept([7, 7, 1])
    # now "...7 1": "7 1" never occurred -> the lookup fallback (the context cache's 1-gram "1" -> 2)
    want = nc.draft(seq + [7, 7, 1], 3, d.context)
    assert d.propose(3).tolist() == want.tolist()


def test_copy_index_incremental_equals_rebuilt():
    toks = stdlib_tokens(5000)
    a = nc.CopyDrafter(n_draft=6)
    a.reset(toks[:100])
    n = 100
    while n < 4000:
        k = 1 + n % 4
        a.accept(toks[n : n + k])
        n += k
        b = nc.CopyDrafter(n_draft=6)
        b.reset(toks[:n])
        assert a.propose(6).tolist() == b.propose(6).tolist()
    assert a._index == b._index


def test_copy_drafter_bad_arguments():
    with pytest.raises(ValueError):
        nc.CopyDrafter(min_match=0)
    with pytest.raises(ValueError):
        nc.CopyDrafter(min_match=5, max_match=4)
    with pytest.raises(ValueError):
        nc.CopyDrafter(max_candidates=0)
