"""ngramcache against data produced by the real llama.cpp (../shared/vectors, see its README).

Every public draft is reproduced exactly with the README's replay loop; llama.cpp's cache
files load to the contents cache-stats.jsonl describes; the replayed context cache, the
merge of the two context caches and files written by ngramcache hold the same
(key -> {token: count}) contents as llama.cpp's files.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

import ngramcache as nc
import reference as ref
from conftest import drafts_sha256, full_rows_sha256, read_drafts

N_DRAFT = 8


# --- canonical form (cache-stats.jsonl) --------------------------------------------

def canonical_bytes(cache: nc.NgramCache) -> bytes:
    """Records sorted by key (4 slots as signed int32, lexicographic), pairs sorted by
    token, in lookup.bin format; built from arrays() with numpy (the caches are large)."""
    keys, offsets, toks, cnts = cache.arrays()
    n = keys.shape[0]
    sizes = np.diff(offsets)
    order = np.lexsort(keys.T[::-1])  # lexsort's last key is the primary one
    # Each pair's record rank in the canonical order, then sort pairs by (rank, token).
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    pair_rank = np.repeat(rank, sizes)
    porder = np.lexsort((toks, pair_rank))
    # Output layout: per record 5 int32 (key, ntokens) followed by 2 int32 per pair.
    rec_sizes = sizes[order]
    rec_start = np.concatenate(([0], np.cumsum(5 + 2 * rec_sizes)[:-1]))
    out = np.empty(5 * n + 2 * toks.size, dtype="<i4")
    head = rec_start[:, None] + np.arange(5)
    out[head[:, :4]] = keys[order]
    out[head[:, 4]] = rec_sizes
    pair_pos = np.repeat(rec_start + 5, rec_sizes) + 2 * (np.arange(toks.size) - np.repeat(
        np.concatenate(([0], np.cumsum(rec_sizes)[:-1])), rec_sizes))
    out[pair_pos] = toks[porder]
    out[pair_pos + 1] = cnts[porder]
    return out.tobytes()


def summary(cache: nc.NgramCache) -> dict:
    keys, offsets, toks, cnts = cache.arrays()
    sizes = (keys >= 0).sum(axis=1)
    return {
        "records": int(keys.shape[0]),
        "pairs": int(toks.size),
        "total_count": int(cnts.sum(dtype=np.int64)),
        "max_count": int(cnts.max()),
        "max_tokens_per_record": int(np.diff(offsets).max()),
        "records_by_ngram_size": {str(s): int((sizes == s).sum()) for s in range(1, 5) if (sizes == s).any()},
        "sha256_canonical": hashlib.sha256(canonical_bytes(cache)).hexdigest(),
    }


@pytest.fixture(scope="module")
def stats(vectors_dir) -> dict:
    with open(vectors_dir / "cache-stats.jsonl") as f:
        return {row["file"]: row for row in map(json.loads, f)}


@pytest.fixture(scope="module")
def loaded(vectors_dir):
    """Each llama.cpp .bin loaded once by ngramcache."""
    cache = {}

    def get(name: str) -> nc.NgramCache:
        if name not in cache:
            cache[name] = nc.NgramCache.load(vectors_dir / name)
        return cache[name]
    return get


def expected(stats: dict, name: str) -> dict:
    row = stats[name]
    return {k: row[k] for k in ("records", "pairs", "total_count", "max_count", "max_tokens_per_record",
                                "records_by_ngram_size", "sha256_canonical")}


def test_canonical_bytes_matches_reference_model():
    rng = np.random.default_rng(3)
    toks = rng.integers(0, 7, 500).tolist()
    cache = nc.NgramCache()
    cache.update(toks)
    model = {}
    ref.update(model, toks)
    assert canonical_bytes(cache) == ref.canonical_bytes(model)


@pytest.mark.parametrize("name", ["static-small.lcs.bin", "prose.context.bin", "dynpub.context.bin",
                                  "merged.prose+dynpub.bin"])
def test_llama_file_loads_to_its_canonical_contents(vectors_dir, stats, loaded, name):
    cache = loaded(name)
    assert summary(cache) == expected(stats, name)
    data = (vectors_dir / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == stats[name]["sha256_file"]
    # Loading keeps the file's record and pair order (what llama.cpp's loader inserts in).
    assert cache.to_bytes() == ref.to_bytes(ref.from_bytes(data))


def test_llama_files_are_rebuilt_byte_for_byte(vectors_dir, prose):
    """Built the way llama.cpp built them, the caches save to the very bytes of its files:
    the record and pair order is libstdc++'s, reproduced."""
    small = np.fromfile(vectors_dir / "small-static.tokens.i32", dtype="<i4")
    static = nc.NgramCache()
    static.update(small, 2, 2)  # llama-lookup-create
    assert static.to_bytes() == (vectors_dir / "static-small.lcs.bin").read_bytes()
    for name in ("prose", "dynpub"):  # incremental updates, one token at a time
        toks = np.fromfile(vectors_dir / f"{name}.tokens.i32", dtype="<i4")
        ctx = nc.NgramCache()
        for i in range(2, toks.size + 1):
            ctx.update(toks[:i], 1, 4, nnew=1)
        assert ctx.to_bytes() == (vectors_dir / f"{name}.context.bin").read_bytes(), name
    merged = nc.NgramCache.load(vectors_dir / "prose.context.bin")  # llama-lookup-merge
    merged.merge(nc.NgramCache.load(vectors_dir / "dynpub.context.bin"))
    assert merged.to_bytes() == (vectors_dir / "merged.prose+dynpub.bin").read_bytes()


def test_reference_parser_agrees_on_a_llama_file(vectors_dir, stats):
    """The pure-Python model reads the same contents (an independent parser)."""
    data = (vectors_dir / "prose.context.bin").read_bytes()
    model = ref.from_bytes(data)
    assert hashlib.sha256(ref.canonical_bytes(model)).hexdigest() == stats["prose.context.bin"]["sha256_canonical"]


def test_merge_of_context_caches_equals_llama_merge(stats, loaded):
    merged = nc.NgramCache()
    merged.merge(loaded("prose.context.bin"))
    merged.merge(loaded("dynpub.context.bin"))
    assert summary(merged) == expected(stats, "merged.prose+dynpub.bin")
    # merge in place on a loaded cache too (as llama-lookup-merge does)
    again = nc.NgramCache.from_bytes(loaded("prose.context.bin").to_bytes())
    again.merge(loaded("dynpub.context.bin"))
    assert canonical_bytes(again) == canonical_bytes(merged)


def test_saved_files_hold_llama_contents(tmp_path, stats, loaded):
    for name in ("static-small.lcs.bin", "merged.prose+dynpub.bin"):
        path = tmp_path / name
        loaded(name).save(path)
        back = nc.NgramCache.load(path)
        assert summary(back) == expected(stats, name)
        assert hashlib.sha256(ref.canonical_bytes(ref.from_bytes(path.read_bytes()))).hexdigest() == \
            stats[name]["sha256_canonical"]
    assert sorted(os.listdir(tmp_path)) == ["merged.prose+dynpub.bin", "static-small.lcs.bin"]


def test_static_cache_built_from_tokens_equals_lookup_create(vectors_dir, stats, tmp_path):
    """update(ngram 2..2) over the small corpus = llama-lookup-create's file."""
    toks = np.fromfile(vectors_dir / "small-static.tokens.i32", dtype="<i4")
    cache = nc.NgramCache()
    cache.update(toks, ngram_min=2, ngram_max=2)
    assert summary(cache) == expected(stats, "static-small.lcs.bin")
    cache.save(tmp_path / "s.bin")
    assert summary(nc.NgramCache.load(tmp_path / "s.bin")) == expected(stats, "static-small.lcs.bin")


# --- the replay loop ----------------------------------------------------------------

def replay(tokens: np.ndarray, dynamic=None, static=None):
    """The README's loop: append, update(1..4, nnew=1) from 2 tokens on, draft 8."""
    context = nc.NgramCache()
    drafts = []
    for pos in range(1, tokens.size + 1):
        inp = tokens[:pos]
        if pos >= 2:
            context.update(inp, 1, 4, nnew=1)
        drafts.append(nc.draft(inp, N_DRAFT, context, dynamic, static).tolist())
    return context, drafts


def compare(got: list, vectors_dir, name: str) -> None:
    """Our drafts against the log's rows, then all of them against the full log's hash
    (which also covers the positions the compact copy leaves out)."""
    want = read_drafts(vectors_dir / name)
    bad = [pos for pos, w in want.items() if got[pos - 1] != w]
    if bad:
        p = bad[0]
        pytest.fail(f"{len(bad)} of {len(want)} drafts differ; first at pos {p}: "
                    f"got {got[p - 1]}, llama.cpp {want[p]}")
    assert drafts_sha256(got) == full_rows_sha256(name), \
        "drafts differ from llama.cpp's at positions the compact copy leaves out (the full set shows where)"


@pytest.fixture(scope="module")
def prose(vectors_dir) -> np.ndarray:
    return np.fromfile(vectors_dir / "prose.tokens.i32", dtype="<i4").astype(np.int32)


@pytest.fixture(scope="module")
def context_only(vectors_dir, prose):
    return replay(prose)


@pytest.fixture(scope="module")
def full_pub(vectors_dir, prose, loaded):
    return replay(prose, loaded("dynpub.context.bin"), loaded("static-small.lcs.bin"))


def test_prose_stream_matches_the_text_count(prose):
    assert prose.size == 60394


def test_context_only_drafts(vectors_dir, context_only):
    compare(context_only[1], vectors_dir, "prose.drafts.context-only.jsonl")
    assert sum(map(len, context_only[1])) == 89120  # the README's totals: the file is the one described


def test_full_pub_drafts(vectors_dir, full_pub):
    compare(full_pub[1], vectors_dir, "prose.drafts.full-pub.jsonl")
    assert sum(map(len, full_pub[1])) == 105740


def test_replayed_context_cache_equals_llama_file(stats, context_only, full_pub):
    assert summary(context_only[0]) == expected(stats, "prose.context.bin")
    # The dynamic and static caches never change the context cache.
    assert canonical_bytes(full_pub[0]) == canonical_bytes(context_only[0])


def test_replayed_context_cache_saved_equals_llama_file(tmp_path, stats, context_only):
    context_only[0].save(tmp_path / "ctx.bin")
    assert summary(nc.NgramCache.load(tmp_path / "ctx.bin")) == expected(stats, "prose.context.bin")


@pytest.mark.parametrize("variant", ["context-only", "full-pub"])
def test_tie_rows(vectors_dir, variant, context_only, full_pub):
    """At every annotated tie, the token llama.cpp chose there is our draft's token at that
    step (or, for chosen = -1, the search fell through: some later source or n-gram decided)."""
    drafts = (context_only if variant == "context-only" else full_pub)[1]
    checked = 0
    with open(vectors_dir / f"prose.drafts.{variant}.ties.jsonl") as f:
        for line in f:
            row = json.loads(line)
            d = drafts[row["pos"] - 1]
            if row["chosen"] >= 0:
                assert row["step"] < len(d) and d[row["step"]] == row["chosen"], row
                assert row["chosen"] not in row["alternatives"]
                checked += 1
            else:
                # The part failed here, so the step was decided elsewhere (or ended the draft).
                assert row["step"] <= len(d), row
    assert checked > 1000


def test_tie_rows_follow_first_seen_latest(vectors_dir, context_only):
    """The tie rule itself, on llama.cpp's own two-candidate context ties: at the draft
    step's position, the chosen token is the one our cache saw first later."""
    prose = np.fromfile(vectors_dir / "prose.tokens.i32", dtype="<i4")
    rows = []
    with open(vectors_dir / "prose.drafts.context-only.ties.jsonl") as f:
        for line in f:
            row = json.loads(line)
            if row["step"] == 0 and row["cache"] == "context" and row["part_size"] == 2 and row["chosen"] >= 0:
                rows.append(row)
    assert len(rows) > 100
    for row in rows[:300]:
        pos, n = row["pos"], row["ngram_size"]
        cache = nc.NgramCache()
        cache.update(prose[:pos], 1, 4)
        part = cache.get(prose[pos - n:pos])
        assert sorted(part) == sorted(t for t, _ in row["part"])
        assert list(part)[-1] == row["chosen"]  # newest first-seen wins
