"""ngramcache.replay and ReplayStats: llama-lookup-stats' loop and its extra figures.

Parity: the three "Tool-level numbers" rows of the vectors README through the API (cache
objects, paths, static tables). Beyond parity, a pure-Python replay built on
tests/reference.py checks every extra figure on random streams.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ngramcache as nc
import reference as ref
from conftest import DYNAMIC_FILE, ROWS, STATIC_FILE, summary_numbers
from ngramcache.cli.main import main as cli_main


# --- parity ----------------------------------------------------------------------------

@pytest.mark.parametrize("caches, drafted, accepted, accept", ROWS)
def test_parity_api(prose, vectors_dir, caches, drafted, accepted, accept):
    static = nc.NgramCache.load(vectors_dir / STATIC_FILE) if "static" in caches else None
    dynamic = nc.NgramCache.load(vectors_dir / DYNAMIC_FILE) if "dynamic" in caches else None
    s = nc.replay(prose, n_ctx=4096, n_draft=8, static=static, dynamic=dynamic)
    assert isinstance(s, nc.ReplayStats)
    assert (s.n_draft, s.n_predict, s.n_chunks) == (8, 57344, 14)
    assert (s.n_drafted, s.n_accept) == (drafted, accepted)
    assert f"{100 * s.accept:.3f}%" == accept
    assert summary_numbers(s.summary())["accept"] == accept


@pytest.mark.parametrize("caches, drafted, accepted, accept", ROWS)
def test_parity_api_paths(prose, vectors_dir, caches, drafted, accepted, accept):
    kw = {}
    if "static" in caches:
        kw["static"] = str(vectors_dir / STATIC_FILE)
    if "dynamic" in caches:
        kw["dynamic"] = vectors_dir / DYNAMIC_FILE
    s = nc.replay(prose, 4096, 8, **kw)
    assert (s.n_drafted, s.n_accept) == (drafted, accepted)
    assert (s.static_load_s is not None) == ("static" in caches)
    assert (s.dynamic_load_s is not None) == ("dynamic" in caches)
    assert s.t_draft_flat == pytest.approx((s.static_load_s or 0) + (s.dynamic_load_s or 0))


@pytest.mark.parametrize("caches, drafted, accepted, accept", ROWS[1:])
def test_parity_static_table(prose, vectors_dir, small_ngst, capsys, caches, drafted, accepted, accept):
    dynamic = vectors_dir / DYNAMIC_FILE if "dynamic" in caches else None
    for static in (nc.StaticTable.open(small_ngst), small_ngst):
        s = nc.replay(prose, 4096, 8, static=static, dynamic=dynamic)
        assert (s.n_drafted, s.n_accept) == (drafted, accepted)
        assert s.static_kind == "static table"
    assert s.static_load_s < 0.1  # a memory map and a header check
    flags = ["-lcs", str(small_ngst)] + (["-lcd", str(dynamic)] if dynamic else [])
    rc = cli_main(["stats", "--tokens", str(vectors_dir / "prose.tokens.i32"), "-c", "4096",
                   "--spec-draft-n-max", "8", "--json", "-q"] + flags)
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and (d["n_drafted"], d["n_accept"], d["static_kind"]) == (drafted, accepted, "static table")


def test_summary_block_format(prose):
    s = nc.replay(prose, 4096, 8)
    lines = s.summary().split("\n")
    assert lines[0] == ""
    assert lines[1:4] == ["n_draft      = 8", "n_predict    = 57344", "n_drafted    = 44330"]
    assert re.fullmatch(r"t_draft_flat = \d+\.\d\d ms", lines[4])
    m = re.fullmatch(r"t_draft      = (\d+\.\d\d) ms, (\d+\.\d\d) us per token, (\d+\.\d\d) tokens per second",
                     lines[5])
    assert m
    assert float(m.group(1)) == pytest.approx(s.t_draft * 1e3, abs=0.006)
    assert float(m.group(2)) == pytest.approx(s.t_draft * 1e6 / s.n_drafted, rel=1e-3, abs=0.006)
    assert lines[6:] == ["n_accept     = 7115", "accept       = 16.050%", ""]


def test_accept_is_float32_like_llama(prose):
    # llama.cpp prints 100.0f * n_accept / n_drafted, computed in float32: for 1418 of
    # 4255 that is 33.326 where float64 gives 33.325.
    s = dataclasses.replace(nc.replay(prose, 4096, 3), n_accept=1418, n_drafted=4255)
    assert f"{100 * 1418 / 4255:.3f}" == "33.325"
    assert summary_numbers(s.summary())["accept"] == "33.326%"


# --- the dynamic cache -----------------------------------------------------------------

def test_dynamic_unchanged_unless_asked(prose, vectors_dir):
    dyn = nc.NgramCache.load(vectors_dir / DYNAMIC_FILE)
    before = dyn.to_bytes()
    a = nc.replay(prose, 4096, 8, dynamic=dyn)
    assert dyn.to_bytes() == before
    b = nc.replay(prose, 4096, 8, dynamic=dyn, update_dynamic=True)
    assert (a.n_drafted, a.n_accept) == (b.n_drafted, b.n_accept)
    # Now dyn holds the original plus every replayed chunk's context cache.
    expect = nc.NgramCache.load(vectors_dir / DYNAMIC_FILE)
    ctx = nc.NgramCache()  # one context cache, cleared after every chunk, as the replay's
    for c in range(b.n_chunks):
        chunk = prose[c * 4096:(c + 1) * 4096]
        for i in range(2, len(chunk) + 1):  # one token at a time, as the replay does
            ctx.update(chunk[:i], nnew=1)
        expect.merge(ctx)
        ctx.clear()
    assert dyn.to_bytes() == expect.to_bytes()


def test_without_dynamic_the_chunks_still_merge(prose):
    # llama.cpp always merges each chunk into its dynamic map, even without -lcd, so later
    # chunks draft from earlier ones: replaying chunk by chunk gives other numbers.
    s = nc.replay(prose, 4096, 8)
    assert s.drafted_by_source["dynamic"] > 0
    alone = [nc.replay(prose[c * 4096:(c + 1) * 4096 + 1], 4096, 8) for c in range(s.n_chunks)]
    assert sum(a.drafted_by_source["dynamic"] for a in alone) == 0
    assert sum(a.n_drafted for a in alone) != s.n_drafted


def test_update_dynamic_needs_a_cache(prose, vectors_dir):
    with pytest.raises(ValueError, match="update_dynamic"):
        nc.replay(prose, 4096, 3, update_dynamic=True)
    with pytest.raises(ValueError, match="update_dynamic"):
        nc.replay(prose, 4096, 3, dynamic=vectors_dir / DYNAMIC_FILE, update_dynamic=True)
    same = nc.NgramCache()
    same.update(prose[:100], 2, 2)
    with pytest.raises(ValueError, match="static"):
        nc.replay(prose, 4096, 3, static=same, dynamic=same, update_dynamic=True)


def test_same_cache_as_static_and_dynamic_without_update(prose):
    # Both roles read the same object: must not deadlock on its lock.
    c = nc.NgramCache()
    c.update(prose[:20000], 2, 2)
    s = nc.replay(prose, 4096, 3, static=c, dynamic=c)
    assert s.n_drafted > 0


# --- the extra figures -----------------------------------------------------------------

def check_consistent(s: nc.ReplayStats) -> None:
    assert sum(s.drafted_by_source.values()) == s.n_drafted
    assert sum(s.accepted_by_source.values()) == s.n_accept
    assert sum(s.drafted_by_ngram.values()) == s.n_drafted
    assert sum(s.accepted_by_ngram.values()) == s.n_accept
    for k in s.drafted_by_source:
        assert 0 <= s.accepted_by_source[k] <= s.drafted_by_source[k]
    for k in s.drafted_by_ngram:
        assert 0 <= s.accepted_by_ngram[k] <= s.drafted_by_ngram[k]
    hist, acc = s.draft_length_hist, s.accept_length_hist
    assert len(hist) == len(acc) == s.n_draft + 1
    assert sum(hist) == s.n_steps
    assert sum(k * n for k, n in enumerate(hist)) == s.n_drafted
    assert sum(acc) == s.n_steps - hist[0]
    assert sum(k * n for k, n in enumerate(acc)) == s.n_accept
    for i in range(s.n_draft):
        assert s.drafted_by_position[i] == sum(hist[i + 1:])
        assert s.accepted_by_position[i] == sum(acc[i + 1:])
    # Each step appends its accepted tokens and one sampled token, except that a step
    # whose accepted tokens fill the chunk gets no sampled one.
    appended = s.n_chunks * (s.n_ctx - 1)
    assert appended <= s.n_steps + s.n_accept <= appended + s.n_chunks
    assert s.overlap_positions == max(s.n_replayed - 2, 0)
    assert max(s.overlap_text, s.overlap_static, s.overlap_dynamic) <= s.overlap_any
    assert s.overlap_any <= min(s.overlap_positions, s.overlap_text + s.overlap_static + s.overlap_dynamic)


def test_extras_on_the_vectors(prose, vectors_dir):
    static = nc.NgramCache.load(vectors_dir / STATIC_FILE)
    dynamic = nc.NgramCache.load(vectors_dir / DYNAMIC_FILE)
    for kw in ({}, {"static": static}, {"static": static, "dynamic": dynamic}):
        s = nc.replay(prose, 4096, 8, **kw)
        check_consistent(s)
        assert (s.drafted_by_source["static"] > 0) == ("static" in kw)
        assert (s.overlap_static > 0) == ("static" in kw)
        assert (s.overlap_dynamic > 0) == ("dynamic" in kw)
        assert s.drafted_by_ngram[2] >= s.drafted_by_source["static"]
        assert s.t_draft > 0 and s.t_replay >= s.t_draft
        assert s.peak_rss_bytes > 10 * 2**20
    # Overlap, counted independently.
    def pairs(cache):
        keys = cache.arrays()[0]
        keys = keys[(keys[:, 1] >= 0) & (keys[:, 2] < 0)]
        return set(zip(keys[:, 0].tolist(), keys[:, 1].tolist()))

    static_pairs, dynamic_pairs = pairs(static), pairs(dynamic)
    toks = prose[:s.n_replayed].tolist()
    seen, n_text, n_static, n_dyn, n_any = set(), 0, 0, 0, 0
    for p in range(2, len(toks)):
        pair = (toks[p - 2], toks[p - 1])
        t, a, d = pair in seen, pair in static_pairs, pair in dynamic_pairs
        seen.add(pair)
        n_text, n_static, n_dyn, n_any = n_text + t, n_static + a, n_dyn + d, n_any + (t or a or d)
    assert (s.overlap_text, s.overlap_static, s.overlap_dynamic, s.overlap_any) == (n_text, n_static, n_dyn, n_any)


def ref_attribute(seq, ctx, dyn, static):
    """(source, n-gram size) of the next drafted token, from the reference model."""
    part_static = static.get(tuple(seq[-2:]), {})
    for cache, ms, mp, name in ((ctx, ref.MIN_SAMPLE_LAX, ref.MIN_PERCENT_LAX, "context"),
                                (dyn, ref.MIN_SAMPLE_STRICT, ref.MIN_PERCENT_STRICT, "dynamic")):
        for size in range(4, 0, -1):
            # One size alone: ngram_min = ngram_max = size, thresholds shifted to match.
            if size <= len(seq) and ref._try_primary(cache, seq, size, size, part_static, ms[size - 1:],
                                                     mp[size - 1:]) is not None:
                return name, size
    return "static", 2


def ref_replay(tokens, n_ctx, n_draft, static=None, dynamic=None, oob_reads=None) -> dict:
    """The loop of docs/llama-lookup.md §5.1 on the reference model, with every extra figure.
    ``oob_reads``: a row of llama.cpp's out-of-bounds reads per chunk (default: the usual ones)."""
    tokens = [int(t) for t in tokens]
    static = static or {}
    dyn = copy.deepcopy(dynamic) if dynamic else {}
    r = {"n_drafted": 0, "n_accept": 0, "n_steps": 0, "n_chunks": 0,
         "drafted_by_source": dict.fromkeys(("context", "dynamic", "static"), 0),
         "accepted_by_source": dict.fromkeys(("context", "dynamic", "static"), 0),
         "drafted_by_ngram": dict.fromkeys(range(1, 5), 0), "accepted_by_ngram": dict.fromkeys(range(1, 5), 0),
         "draft_length_hist": [0] * (n_draft + 1), "accept_length_hist": [0] * (n_draft + 1),
         "drafted_by_position": [0] * n_draft, "accepted_by_position": [0] * n_draft}
    i_start = 0
    while i_start + n_ctx < len(tokens):
        sl = tokens[i_start:i_start + n_ctx]
        ctx: dict = {}
        out = [sl[0]]
        while len(out) < n_ctx:
            reads = ref.LLAMA_OOB_READS if oob_reads is None else tuple(oob_reads[r["n_chunks"]])
            d = ref.draft(out, n_draft, ctx, dyn, static, llama_oob=reads)
            seq, origin = ref.oob_prefix(len(out), reads) + out, []
            for k, tok in enumerate(d):
                origin.append(ref_attribute(seq, ctx, dyn, static))
                seq.append(tok)
                ref.oob_grown(seq, len(out), k + 1, reads)
            r["n_steps"] += 1
            r["n_drafted"] += len(d)
            r["draft_length_hist"][len(d)] += 1
            for j, (src, size) in enumerate(origin):
                r["drafted_by_position"][j] += 1
                r["drafted_by_source"][src] += 1
                r["drafted_by_ngram"][size] += 1
            acc = 0
            for j, tok in enumerate(d):
                if len(out) >= n_ctx or sl[len(out)] != tok:
                    break
                out.append(tok)
                ref.update(ctx, out, 1, 4, nnew=1)
                acc += 1
                r["accepted_by_position"][j] += 1
                r["accepted_by_source"][origin[j][0]] += 1
                r["accepted_by_ngram"][origin[j][1]] += 1
            r["n_accept"] += acc
            if d:
                r["accept_length_hist"][acc] += 1
            if len(out) < n_ctx:
                out.append(sl[len(out)])
                ref.update(ctx, out, 1, 4, nnew=1)
        ref.merge(dyn, ctx)
        r["n_chunks"] += 1
        i_start += n_ctx
    return r


def to_cache(model: dict) -> nc.NgramCache:
    return nc.NgramCache.from_bytes(ref.to_bytes(model))


streams = st.lists(st.integers(0, 4), min_size=0, max_size=160)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=streams, n_ctx=st.integers(2, 40), n_draft=st.integers(0, 6), static_text=streams,
       dynamic_text=st.one_of(st.none(), streams), vocab_shift=st.sampled_from([0, 1000, 2**31 - 6]))
def test_replay_matches_reference(text, n_ctx, n_draft, static_text, dynamic_text, vocab_shift):
    text = [t + vocab_shift for t in text]
    static_m: dict = {}
    ref.update(static_m, [t + vocab_shift for t in static_text], 2, 2)
    dynamic_m = None
    if dynamic_text is not None:
        dynamic_m = {}
        ref.update(dynamic_m, [t + vocab_shift for t in dynamic_text], 1, 4)
    static = to_cache(static_m) if static_m else None
    dynamic = to_cache(dynamic_m) if dynamic_m is not None else None
    # Both went through a file, as llama.cpp's do: the model drafts with what was loaded.
    static_m = ref.from_bytes(ref.to_bytes(static_m))
    dynamic_m = None if dynamic_m is None else ref.from_bytes(ref.to_bytes(dynamic_m))
    expect = ref_replay(text, n_ctx, n_draft, static_m, dynamic_m)
    if len(text) <= n_ctx:
        with pytest.raises(ValueError, match="too short"):
            nc.replay(np.array(text, dtype=np.int64), n_ctx, n_draft, static=static, dynamic=dynamic)
        return
    s = nc.replay(np.array(text, dtype=np.int64), n_ctx, n_draft, static=static, dynamic=dynamic)
    got = {k: getattr(s, k) for k in expect}
    assert got == expect
    check_consistent(s)


def test_replay_with_recorded_reads_matches_reference():
    """Reads drawn from the streams' own alphabet, so that the keys reaching before a
    chunk's start are found (in the dynamic cache the chunks merge into), including the
    slot read again once the draft vector has grown; the model must agree every time."""
    rng = np.random.default_rng(20261204)
    reads_mattered = grown_mattered = 0
    for _ in range(250):
        n_ctx = int(rng.integers(2, 13))
        text = rng.integers(0, 4, int(rng.integers(n_ctx + 1, 200))).tolist()
        reads = rng.integers(0, 5, ((len(text) - 1) // n_ctx, 4))
        n_draft = int(rng.integers(1, 6))
        expect = ref_replay(text, n_ctx, n_draft, oob_reads=reads.tolist())
        s = nc.replay(np.array(text), n_ctx, n_draft, llama_oob=reads)
        assert {k: getattr(s, k) for k in expect} == expect
        check_consistent(s)
        unread = nc.replay(np.array(text), n_ctx, n_draft, llama_oob=False)
        same_slot = reads.copy()
        same_slot[:, 2] = same_slot[:, 1]
        regrown = nc.replay(np.array(text), n_ctx, n_draft, llama_oob=same_slot)
        figures = lambda r: (r.n_drafted, r.n_accept, r.drafted_by_ngram, r.accepted_by_ngram)  # noqa: E731
        reads_mattered += figures(unread) != figures(s)
        grown_mattered += figures(regrown) != figures(s)
    # not vacuous: both kinds of read changed some replays
    assert reads_mattered >= 20 and grown_mattered >= 3


# --- progress, threads -----------------------------------------------------------------

def test_progress_callback(prose):
    long = np.concatenate([prose, prose, prose])  # 181,182 tokens
    calls = []
    s = nc.replay(long, 4096, 3, progress=lambda done, total: calls.append((done, total)))
    total = s.n_replayed
    assert calls[-1] == (total, total)
    dones = [d for d, _ in calls]
    assert dones == sorted(dones)
    assert all(t == total for _, t in calls)
    # At most one call per 100,000 tokens, plus the final one.
    assert 2 <= len(calls) <= total // 100_000 + 1
    assert all(b - a >= 100_000 for a, b in zip(dones[:-2], dones[1:-1]))


def test_progress_exception_stops_the_replay(prose):
    long = np.concatenate([prose, prose, prose])

    def boom(done, total):
        raise RuntimeError(f"stop at {done}")

    with pytest.raises(RuntimeError, match="stop at"):
        nc.replay(long, 4096, 3, progress=boom)
    with pytest.raises(TypeError, match="progress"):
        nc.replay(long, 4096, 3, progress=42)


def test_threads_give_identical_results(prose, vectors_dir):
    static = nc.NgramCache.load(vectors_dir / STATIC_FILE)
    dynamic = nc.NgramCache.load(vectors_dir / DYNAMIC_FILE)
    results = [None] * 3

    def work(i):
        results[i] = nc.replay(prose, 4096, 8, static=static, dynamic=dynamic)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {(r.n_drafted, r.n_accept) for r in results} == {(53695, 8967)}


# --- API edge cases and errors ---------------------------------------------------------

def test_n_predict_formula_and_exact_multiple(prose):
    s = nc.replay(prose[:3 * 100], 100, 3)
    # The last, exactly-fitting chunk is skipped, yet n_predict counts it (llama.cpp's formula).
    assert (s.n_chunks, s.n_predict, s.n_replayed) == (2, 300, 200)
    s = nc.replay(prose[:3 * 100 + 1], 100, 3)
    assert (s.n_chunks, s.n_predict) == (3, 300)


def test_n_draft_zero(prose):
    s = nc.replay(prose, 4096, 0)
    assert (s.n_drafted, s.n_accept, s.n_steps) == (0, 0, 14 * 4095)
    text = s.summary()
    assert "n_drafted    = 0" in text
    assert re.search(r"^accept       = nan%$", text, re.M)
    assert math.isnan(s.accept)
    d = s.to_dict()
    assert d["accept"] is None
    json.dumps(d, allow_nan=False)
    s.table()


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_ctx=1, n_draft=3), "n_ctx must be >= 2"),
    (dict(n_ctx=0, n_draft=3), "n_ctx must be >= 2"),
    (dict(n_ctx=4096, n_draft=-1), "n_draft must be >= 0"),
    (dict(n_ctx=4096.0, n_draft=3), "n_ctx must be an integer"),
    (dict(n_ctx=4096, n_draft=True), "n_draft must be an integer"),
    (dict(n_ctx=4096, n_draft=1 << 20), "n_draft must be <="),
    (dict(n_ctx=60394, n_draft=3), "too short"),
])
def test_api_errors(prose, kwargs, match):
    with pytest.raises(ValueError, match=match):
        nc.replay(prose, **kwargs)


def test_api_bad_inputs(prose, tmp_path):
    with pytest.raises(ValueError, match="too short"):
        nc.replay([], 4096, 3)
    with pytest.raises(ValueError, match="negative"):
        nc.replay([1, 2, -3, 4], 2, 3)
    with pytest.raises(TypeError, match="static"):
        nc.replay(prose, 4096, 3, static=42)
    with pytest.raises(TypeError, match="dynamic"):
        nc.replay(prose, 4096, 3, dynamic=[1, 2])
    with pytest.raises(FileNotFoundError):
        nc.replay(prose, 4096, 3, static=tmp_path / "missing.bin")
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\x01\x00\x00\x00" * 5)
    with pytest.raises(nc.CacheFormatError, match="bad.bin"):
        nc.replay(prose, 4096, 3, dynamic=bad)


def test_to_dict_is_json(prose, vectors_dir):
    s = nc.replay(prose, 4096, 8, static=vectors_dir / STATIC_FILE)
    d = json.loads(json.dumps(s.to_dict(), allow_nan=False))
    assert d["n_drafted"] == 50387 and d["n_accept"] == 7938
    assert d["static_kind"] == "lookup.bin"
    assert d["drafted_by_ngram"]["2"] == s.drafted_by_ngram[2]
    assert d["accept"] == pytest.approx(7938 / 50387)
    assert d["n_replayed"] == 57344
