"""StaticTable (the NGST file): build, open, verify, llama.cpp import/export, drafting, errors.

The contract: a StaticTable holds exactly the counts an NgramCache would (built by
update(tokens, n, n), or loaded from the same lookup.bin), its stored best token follows
the core's tie rule, and drafting with it gives the same decisions at every position. Any
damaged file raises CacheFormatError (at open for the header and sizes, at verify for the
rest) and never crashes, even when it is used unverified.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import ngramcache as nc
from conftest import drafts_sha256, full_rows_sha256, read_drafts
from ngramcache import CacheFormatError, StaticTable
from reference_libstdcxx import part_order

N_DRAFT = 8


# --- helpers -------------------------------------------------------------------------

def canonical(keys, offsets, toks, cnts, best_token, best_count, sums):
    """Keys sorted, entries by token within a key: arrays that compare with ==."""
    k = keys.shape[0]
    order = np.lexsort(keys.T[::-1]) if k else np.zeros(0, dtype=np.int64)
    sizes = np.diff(offsets)
    seg = np.repeat(np.arange(k), sizes)
    rank = np.empty(k, dtype=np.int64)
    rank[order] = np.arange(k)
    porder = np.lexsort((toks, rank[seg]))
    return (keys[order], sizes[order], toks[porder], cnts[porder],
            best_token[order], best_count[order], sums[order])


def llama_best(tokens, counts, direct: bool) -> int:
    """The token llama.cpp's try_static picks from a part: the first highest count in its
    map's iteration order. ``direct``: the map was built by inserting the tokens in this
    order (a loaded file's record, or a cache used as it is); otherwise the part reaches
    llama.cpp through the lookup.bin saved from it (its order goes through save and load)."""
    order = part_order(tokens)
    if not direct:
        saved = order
        order = [saved[i] for i in part_order([tokens[j] for j in saved])]
    mx = max(counts)
    return next(tokens[i] for i in order if counts[i] == mx)


def cache_canonical(cache: nc.NgramCache, n: int, direct: bool = False):
    """canonical() of the keys of size n of a cache, with the best token as llama.cpp
    picks it (llama_best), computed with numpy where no tie needs the order."""
    keys, offsets, toks, cnts = cache.arrays()
    sizes = (keys >= 0).sum(axis=1)
    sel = np.flatnonzero(sizes == n)
    lens = np.diff(offsets)[sel]
    idx = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in sel]) if sel.size else np.zeros(0, int)
    t, c = toks[idx].astype(np.int64), cnts[idx].astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64)
    seg = np.repeat(np.arange(sel.size), lens)
    if sel.size:
        mx = np.maximum.reduceat(c, starts)
        at_max = np.add.reduceat((c == mx[seg]).astype(np.int64), starts)
        last = np.maximum.reduceat(np.where(c == mx[seg], np.arange(c.size), -1), starts)
        best_t, best_c, sums = t[last], c[last], np.add.reduceat(c, starts)
        for k in np.flatnonzero(at_max > 1):
            a, b = starts[k], starts[k] + lens[k]
            best_t[k] = llama_best(t[a:b].tolist(), c[a:b].tolist(), direct)
    else:
        best_t = best_c = sums = np.zeros(0, np.int64)
    new_offsets = np.concatenate(([0], np.cumsum(lens)))
    return canonical(keys[sel][:, :n], new_offsets, t, c, best_t, best_c, sums)


def assert_same_as_cache(table: StaticTable, cache: nc.NgramCache, n: int, direct: bool = False) -> None:
    """Key by key: the same counts, and best token / count / sum as llama.cpp has them."""
    a = table.arrays()
    got = canonical(*(a[k] for k in ("keys", "offsets", "tokens", "counts", "best_token", "best_count", "sum")))
    want = cache_canonical(cache, n, direct)
    names = ("keys", "entries per key", "tokens", "counts", "best token", "best count", "sum")
    for name, g, w in zip(names, got, want):
        assert g.shape == w.shape and np.array_equal(g, w), name
    assert len(table) == want[0].shape[0]
    assert table.n_entries == want[2].size
    assert table.total == int(want[3].sum())


def stdlib_tokens(n_bytes: int, offset: int = 0) -> np.ndarray:
    """Real text: stdlib source as bytes (token = byte value, a 256-token vocabulary)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, have = [], 0
    for p in sorted(root.glob("*.py")):
        data = p.read_bytes()
        chunks.append(data)
        have += len(data)
        if have >= n_bytes + offset:
            break
    return np.frombuffer(b"".join(chunks)[offset:offset + n_bytes], dtype=np.uint8).astype(np.int32)


def word_tokens(n_bytes: int) -> np.ndarray:
    """Real text with a word-level vocabulary (ids by first appearance)."""
    import re
    text = stdlib_tokens(n_bytes).astype(np.uint8).tobytes().decode("latin-1")
    vocab: dict[str, int] = {}
    return np.array([vocab.setdefault(w, len(vocab)) for w in re.findall(r"\w+|\S|\s+", text)], dtype=np.int32)


def replay(tokens: np.ndarray, dynamic, statics: list) -> list[list[list[int]]]:
    """The vectors' loop (append, update(1..4, nnew=1), draft 8), drafting with each of
    `statics` at every position from the same context cache."""
    context = nc.NgramCache()
    out = [[] for _ in statics]
    for pos in range(1, tokens.size + 1):
        inp = tokens[:pos]
        if pos >= 2:
            context.update(inp, 1, 4, nnew=1)
        for i, st in enumerate(statics):
            out[i].append(nc.draft(inp, N_DRAFT, context, dynamic, st).tolist())
    return out


def first_difference(got: list, want: list) -> str | None:
    assert len(got) == len(want)
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if bad:
        p = bad[0]
        return f"{len(bad)} of {len(want)} drafts differ; first at pos {p + 1}: {got[p]} vs {want[p]}"
    return None


@pytest.fixture(scope="module")
def small_static(vectors_dir) -> np.ndarray:
    return np.fromfile(vectors_dir / "small-static.tokens.i32", dtype="<i4").astype(np.int32)


@pytest.fixture(scope="module")
def prose(vectors_dir) -> np.ndarray:
    return np.fromfile(vectors_dir / "prose.tokens.i32", dtype="<i4").astype(np.int32)


@pytest.fixture(scope="module")
def table_file(tmp_path_factory) -> Path:
    """A saved table of real text with keys of one and of several continuations."""
    p = tmp_path_factory.mktemp("ngst") / "t.ngst"
    StaticTable.build(stdlib_tokens(20_000)).save(p)
    return p


# --- building --------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["small-vocab", "vocab-200k", "huge-ids"])
def test_build_matches_ngramcache_update(n, kind):
    rng = np.random.default_rng(1000 * n + len(kind))
    if kind == "small-vocab":  # many repeats: ties, large parts
        toks = rng.integers(0, 7, 3000)
    elif kind == "vocab-200k":  # wide ids: 3- and 4-grams take the 128-bit packing
        toks = rng.integers(0, 200_000, 3000)
        toks[::3] = rng.integers(0, 5, toks[::3].size)  # and some repeats
    else:  # sparse ids up to 2^31 - 1: renumbered before packing
        vocab = rng.integers(0, 2**31 - 1, 40, dtype=np.int64)
        vocab[0] = 2**31 - 1
        toks = vocab[rng.integers(0, vocab.size, 3000)]
    toks = toks.astype(np.int32)
    table = StaticTable.build(toks, ngram_size=n)
    cache = nc.NgramCache()
    cache.update(toks, n, n)
    assert table.ngram_size == n
    assert table.total == toks.size - n
    assert_same_as_cache(table, cache, n)
    table.verify()


def test_build_matches_ngramcache_on_real_streams(small_static, prose):
    for toks in (small_static, prose, word_tokens(200_000)):
        table = StaticTable.build(toks)
        cache = nc.NgramCache()
        cache.update(toks, 2, 2)
        assert_same_as_cache(table, cache, 2)


def test_build_of_a_long_stream_matches_ngramcache():
    # Above ~1 M tokens the build hands processed memory back to the kernel as it scans;
    # the shorter streams above never reach that path.
    rng = np.random.default_rng(7)
    toks = rng.zipf(1.3, 1_300_000) % 30_000
    toks = toks.astype(np.int32)
    table = StaticTable.build(toks)
    cache = nc.NgramCache()
    cache.update(toks, 2, 2)
    assert table.total == toks.size - 2
    assert_same_as_cache(table, cache, 2)
    table.verify()


def test_tie_rule_is_llama_cpp_s_through_a_file():
    # after (1, 2): 5 6 6 5. Counts tie 2:2. llama.cpp's in-memory map visits the newer
    # token 6 first; llama-lookup-create's file lists 6 then 5, and the map loaded from it
    # visits 5 first. A built table is that file, so 5 is its best token.
    toks = [1, 2, 5, 1, 2, 6, 1, 2, 6, 1, 2, 5]
    t = StaticTable.build(toks)
    assert t.get([1, 2]) == {5: 2, 6: 2}
    assert t.best([1, 2]) == (5, 2, 4)
    cache = nc.NgramCache()
    cache.update(toks, 2, 2)
    assert llama_records(cache.to_bytes())[(1, 2)] == [(6, 2), (5, 2)]
    ctx = nc.NgramCache()
    from_file = nc.NgramCache.from_bytes(cache.to_bytes())
    assert nc.draft([1, 2], 1, ctx, static=t).tolist() == nc.draft([1, 2], 1, ctx, static=from_file).tolist() == [5]
    assert nc.draft([1, 2], 1, ctx, static=cache).tolist() == [6]


def test_small_and_empty_inputs():
    for toks in ([], [3], [3, 4]):
        t = StaticTable.build(toks)
        assert len(t) == 0 and t.total == 0 and t.n_entries == 0
        assert t.get([3, 4]) == {} and t.best([3, 4]) is None and [3, 4] not in t
        t.verify()
        assert StaticTable.from_bytes(t.to_bytes()).info()["n_keys"] == 0
    t = StaticTable.build([3, 4, 5])
    assert len(t) == 1 and t.get([3, 4]) == {5: 1} and [3, 4] in t


def test_same_counts_give_the_same_bytes(small_static, tmp_path):
    """Files are canonical: the layout depends on the contents only."""
    a = StaticTable.build(small_static)
    cache = nc.NgramCache()
    cache.update(small_static, 2, 2)
    # build() decides ties as llama.cpp does with the lookup.bin of the same counts, so the
    # cache goes through that file first.
    b = StaticTable.from_cache(nc.NgramCache.from_bytes(cache.to_bytes()))
    # The source byte (10) and with it the header check differ; all sections are equal.
    assert a.to_bytes()[64:] == b.to_bytes()[64:]
    assert (a.info()["source"], b.info()["source"]) == ("tokens", "NgramCache")


def test_pinned_file_image():
    """The hash, checksum, layout and best-token rule are part of the format: this image
    must not change (key (2, 3) ties 1:1; its best token is 1, as llama.cpp's loader of the
    lookup.bin of these tokens picks)."""
    t = StaticTable.build([1, 2, 3, 1, 2, 4, 1, 2, 3, 7, 7, 7, 7])
    img = t.to_bytes()
    assert len(img) == t.nbytes == t.info()["file_size"]
    assert hashlib.sha256(img).hexdigest() == PINNED_SHA256, img.hex()


PINNED_SHA256 = "73e44a30302881f51dc5b6168335dc5c159666943eb42cbd91a0670838e982ea"


def test_build_rejects_bad_input():
    with pytest.raises(ValueError, match="ngram_size"):
        StaticTable.build([1, 2, 3], ngram_size=0)
    with pytest.raises(ValueError, match="ngram_size"):
        StaticTable.build([1, 2, 3], ngram_size=5)
    with pytest.raises(ValueError, match="negative"):
        StaticTable.build([1, -2, 3])
    with pytest.raises(ValueError):
        StaticTable.build([1.5, 2.0])
    with pytest.raises(TypeError):
        StaticTable(None)


# --- save, open, round trips -----------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_save_open_round_trip_random(tmp_path, seed):
    rng = np.random.default_rng(seed)
    n = 1 + seed % 4
    toks = rng.integers(0, [3, 50, 5000, 70000][seed], 5000).astype(np.int32)
    built = StaticTable.build(toks, ngram_size=n)
    p = tmp_path / "r.ngst"
    built.save(p)
    opened = StaticTable.open(p)
    assert opened.mapped and not built.mapped and opened.path == str(p)
    assert opened.to_bytes() == built.to_bytes() == p.read_bytes()
    opened.verify()
    for k in {tuple(toks[i:i + n].tolist()) for i in range(0, toks.size - n, 97)}:
        assert opened.get(k) == built.get(k) and opened.best(k) == built.best(k)


def test_save_open_round_trip_real(tmp_path, small_static):
    built = StaticTable.build(small_static)
    built.save(tmp_path / "s.ngst")
    opened = StaticTable.open(tmp_path / "s.ngst")
    opened.verify()
    for name, arr in built.arrays().items():
        assert np.array_equal(arr, opened.arrays()[name]), name
    assert opened.info() | {"path": None, "mapped": False} == built.info()
    assert StaticTable.read_header(tmp_path / "s.ngst") == {k: v for k, v in built.info().items()
                                                            if k not in ("path", "mapped")}


def test_header_fields(table_file):
    h = StaticTable.read_header(table_file)
    t = StaticTable.open(table_file)
    assert h["magic"] == "NGST" and h["version"] == 1 and h["byte_order"] == "little"
    assert (h["ngram_size"], h["n_keys"], h["n_entries"], h["total"]) == (2, len(t), t.n_entries, t.total)
    assert h["file_size"] == table_file.stat().st_size == t.nbytes
    raw = table_file.read_bytes()[:64]
    assert raw[:4] == b"NGST" and raw[6:8] == b"\xff\xfe"
    assert struct.unpack_from("<HHBBBxIQQI", raw, 4) == (
        1, 0xFEFF, 2, h["bucket_bits"], 0, h["n_keys"], h["n_entries"], h["total"], h["n_stored"])
    secs = h["sections"]
    assert secs["index"][0] == 64
    for name in ("index", "records", "entries"):
        assert secs[name][0] % 64 == 0
    assert secs["records"][1] == h["n_keys"] * h["record_size"] and secs["entries"][1] == 8 * h["n_stored"]


def test_saving_over_the_mapped_file_keeps_the_old_mapping(tmp_path):
    p = tmp_path / "t.ngst"
    StaticTable.build([1, 2, 3, 1, 2, 3]).save(p)
    old = StaticTable.open(p)
    old.save(p)  # over its own file: atomic rename, the mapping keeps the old inode
    StaticTable.build([1, 2, 9]).save(p)
    assert old.get([1, 2]) == {3: 2}
    old.verify()
    assert StaticTable.open(p).get([1, 2]) == {9: 1}


def test_immutable():
    t = StaticTable.build([1, 2, 3, 1, 2, 4])
    for name in ("update", "merge", "clear", "add", "_update", "_merge", "_clear", "_load_into"):
        assert not hasattr(t, name)
    with pytest.raises(AttributeError):
        t.total = 5
    with pytest.raises(AttributeError):
        t.anything = 1
    a = t.arrays()
    for arr in a.values():
        with pytest.raises(ValueError):
            arr[...] = 0
    assert t.get([1, 2]) == {3: 1, 4: 1}


# --- llama.cpp's lookup.bin ------------------------------------------------------------

def test_import_llama_static_cache_equals_ngramcache_load(vectors_dir):
    path = vectors_dir / "static-small.lcs.bin"
    table = StaticTable.from_llama(path)
    cache = nc.NgramCache.load(path)
    assert (len(table), table.n_entries, table.total) == (79343, 143761, 248750)  # README figures
    assert table.info()["source"] == "lookup.bin"
    # Loaded from a file: ties go as in the map that loading the records in file order builds.
    assert_same_as_cache(table, cache, 2, direct=True)
    table.verify()


def test_import_of_the_creator_file_equals_build_from_its_tokens(vectors_dir, small_static):
    """llama-lookup-create's file and StaticTable.build of the same tokens: same counts."""
    a = StaticTable.from_llama(vectors_dir / "static-small.lcs.bin").arrays()
    b = StaticTable.build(small_static).arrays()
    for name in ("keys", "offsets", "tokens", "counts", "best_count", "sum"):
        assert np.array_equal(a[name], b[name]), name


def test_to_llama_round_trip(vectors_dir, tmp_path):
    src = vectors_dir / "static-small.lcs.bin"
    table = StaticTable.from_llama(src)
    table.to_llama(tmp_path / "out.bin")
    assert (tmp_path / "out.bin").stat().st_size == src.stat().st_size
    assert table.to_llama_bytes() == (tmp_path / "out.bin").read_bytes()
    # llama.cpp's loader semantics (NgramCache.load) see the same counts and best tokens.
    assert_same_as_cache(table, nc.NgramCache.load(tmp_path / "out.bin"), 2, direct=True)
    again = StaticTable.from_llama(tmp_path / "out.bin")
    assert again.to_bytes()[64:] == table.to_bytes()[64:]
    # And the original file's contents: same canonical form.
    want = cache_canonical(nc.NgramCache.load(src), 2)[:4]
    got = cache_canonical(nc.NgramCache.load(tmp_path / "out.bin"), 2)[:4]
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def llama_records(img: bytes) -> dict:
    """{key tuple: [(token, count), ...] in file order} of a lookup.bin image."""
    out, off = {}, 0
    while off < len(img):
        key = tuple(t for t in struct.unpack_from("<4i", img, off) if t >= 0)
        ntok = struct.unpack_from("<i", img, off + 16)[0]
        vals = struct.unpack_from(f"<{2 * ntok}i", img, off + 20)
        out[key] = list(zip(vals[::2], vals[1::2]))
        off += 20 + 8 * ntok
    return out


def test_to_llama_lists_pairs_so_that_the_loader_picks_the_best_token():
    t = StaticTable.build([1, 2, 6, 1, 2, 3, 1, 2, 5, 1, 2, 5, 1, 2, 3, 1, 2, 6])
    # 6, 3 and 5 tie: the in-memory map visits 5 3 6, its file lists them so, and the map
    # loaded from that file visits 6 first.
    assert t.best([1, 2]) == (6, 2, 6)
    records = llama_records(t.to_llama_bytes())
    tokens, counts = zip(*records[(1, 2)])
    assert sorted(records[(1, 2)]) == [(3, 2), (5, 2), (6, 2)]
    assert llama_best(list(tokens), list(counts), direct=True) == 6
    assert nc.NgramCache.from_bytes(t.to_llama_bytes()).get([1, 2]) == {3: 2, 5: 2, 6: 2}
    t2 = StaticTable.build([1, 2, 7, 1, 2, 3, 1, 2, 3])  # no tie: pairs sorted by token
    assert llama_records(t2.to_llama_bytes())[(1, 2)] == [(3, 2), (7, 1)]


def test_to_llama_ties_survive_collisions_and_rehashes(tmp_path):
    """Parts whose tokens share buckets (ids equal mod 13) and parts big enough to rehash:
    the exported file makes llama.cpp's loader pick the table's best token every time."""
    rng = np.random.default_rng(7)
    toks = []
    for key in range(60):
        size = int(rng.integers(2, 40))
        conts = rng.choice(np.arange(0, 13 * 60, 13) if key % 2 else np.arange(1000), size, replace=False)
        for c in conts:
            toks += [10_000 + key, 20_000, int(c)] * 2
    t = StaticTable.build(toks)
    p = tmp_path / "t.bin"
    t.to_llama(p)
    again = StaticTable.from_llama(p)
    a, b = t.arrays(), again.arrays()
    for name in ("keys", "best_token", "best_count", "sum"):
        assert np.array_equal(a[name], b[name]), name
    assert_same_as_cache(t, nc.NgramCache.load(p), 2, direct=True)


def llama_record(key, pairs) -> bytes:
    k = list(key) + [-1] * (4 - len(key))
    return struct.pack(f"<4ii{2 * len(pairs)}i", *k, len(pairs), *[x for p in pairs for x in p])


def test_import_tie_rule_is_the_later_token_of_the_record(tmp_path):
    (tmp_path / "a.bin").write_bytes(llama_record((1, 2), [(5, 2), (6, 2)]) + llama_record((3, 4), [(9, 1)]))
    (tmp_path / "b.bin").write_bytes(llama_record((1, 2), [(6, 2), (5, 2)]))
    assert StaticTable.from_llama(tmp_path / "a.bin").best([1, 2]) == (6, 2, 4)
    assert StaticTable.from_llama(tmp_path / "b.bin").best([1, 2]) == (5, 2, 4)


def test_import_duplicates_like_the_loader(tmp_path):
    """llama.cpp's loader keeps the first record of a key and the first pair of a token."""
    p = tmp_path / "d.bin"
    p.write_bytes(llama_record((1, 2), [(5, 1), (5, 7), (6, 3)]) + llama_record((1, 2), [(8, 9)]))
    t = StaticTable.from_llama(p)
    assert t.get([1, 2]) == nc.NgramCache.load(p).get([1, 2]) == {5: 1, 6: 3}


def test_import_mixed_sizes_needs_ngram_size(vectors_dir):
    path = vectors_dir / "dynpub.context.bin"  # keys of sizes 1..4
    with pytest.raises(ValueError, match="sizes 1, 2, 3, 4"):
        StaticTable.from_llama(path)
    cache = nc.NgramCache.load(path)
    for n in (1, 2, 4):
        t = StaticTable.from_llama(path, ngram_size=n)
        assert_same_as_cache(t, cache, n, direct=True)


def test_import_errors(tmp_path):
    (tmp_path / "bad.bin").write_bytes(llama_record((1, 2), [(5, 1)])[:-4])
    with pytest.raises(CacheFormatError, match="truncated"):
        StaticTable.from_llama(tmp_path / "bad.bin")
    with pytest.raises(FileNotFoundError):
        StaticTable.from_llama(tmp_path / "missing.bin")
    (tmp_path / "empty.bin").write_bytes(b"")
    assert len(StaticTable.from_llama(tmp_path / "empty.bin")) == 0  # llama.cpp: an empty cache


def test_cache_round_trip(small_static):
    table = StaticTable.build(small_static)
    cache = table.to_cache()
    assert isinstance(cache, nc.NgramCache)
    # first-seen order of the cache keeps each key's best token
    assert StaticTable.from_cache(cache).to_bytes()[64:] == table.to_bytes()[64:]
    with pytest.raises(TypeError):
        StaticTable.from_cache(table)


# --- drafting --------------------------------------------------------------------------

def test_full_pub_drafts_with_an_imported_static_table(vectors_dir, prose):
    """The vectors' full-pub variant with the static cache as a StaticTable: every one of
    llama.cpp's drafts, and the same as with the cache loaded as an NgramCache."""
    dynamic = nc.NgramCache.load(vectors_dir / "dynpub.context.bin")
    static_file = vectors_dir / "static-small.lcs.bin"
    table = StaticTable.from_llama(static_file)
    with_table, with_cache = replay(prose, dynamic, [table, nc.NgramCache.load(static_file)])
    want = read_drafts(vectors_dir / "prose.drafts.full-pub.jsonl")
    assert {pos: with_table[pos - 1] for pos in want} == want
    # every position, those the compact copy leaves out too
    assert drafts_sha256(with_table) == full_rows_sha256("prose.drafts.full-pub.jsonl")
    assert first_difference(with_table, with_cache) is None
    assert sum(map(len, with_table)) == 105740


def test_drafts_with_a_built_table_equal_those_with_an_updated_cache(small_static, prose, tmp_path):
    """StaticTable.build(tokens) vs NgramCache.update(tokens, 2, 2) (first-seen order =
    corpus order), mapped from a file, with and without a dynamic cache."""
    StaticTable.build(small_static).save(tmp_path / "s.ngst")
    table = StaticTable.open(tmp_path / "s.ngst")
    cache = nc.NgramCache()
    cache.update(small_static, 2, 2)
    cache = nc.NgramCache.from_bytes(cache.to_bytes())  # as llama-lookup-create's file, loaded
    stream = prose[:20000]
    a, b = replay(stream, None, [table, cache])
    assert first_difference(a, b) is None
    assert sum(map(len, a)) > 1000
    # Static-only drafting (empty context): every step is the stored best token.
    empty = nc.NgramCache()
    for pos in range(2, 20000, 7):
        assert nc.draft(stream[:pos], N_DRAFT, empty, None, table).tolist() == \
            nc.draft(stream[:pos], N_DRAFT, empty, None, cache).tolist()


def test_draft_from_threads(small_static, prose):
    table = StaticTable.build(small_static)
    ctx = nc.NgramCache()
    ctx.update(prose[:5000])
    positions = range(2, 5000, 3)

    def run(_):
        return [nc.draft(prose[:p], N_DRAFT, ctx, None, table).tolist() for p in positions]

    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(run, range(4)))
    assert all(r == results[0] for r in results)


def test_draft_needs_a_2gram_table():
    t = StaticTable.build([1, 2, 3, 4, 1, 2, 3, 5], ngram_size=3)
    with pytest.raises(ValueError, match="2-grams"):
        nc.draft([1, 2, 3], 4, nc.NgramCache(), static=t)
    with pytest.raises(TypeError, match="StaticTable"):
        nc.draft([1, 2, 3], 4, nc.NgramCache(), static="x")


def test_lookup_argument_errors():
    t = StaticTable.build([1, 2, 3])
    with pytest.raises(ValueError, match="2-grams"):
        t.get([1, 2, 3])
    with pytest.raises(ValueError, match="2-grams"):
        t.best([1])
    with pytest.raises(ValueError, match="negative"):
        t.get([-1, 2])


# --- damaged files ---------------------------------------------------------------------

def exercise(table: StaticTable, tokens: np.ndarray) -> None:
    """Use a possibly damaged table every way there is; results may be wrong, but
    nothing may crash or read out of bounds (run under AddressSanitizer once)."""
    n = table.ngram_size
    for i in range(0, max(0, tokens.size - n), 41):
        table.get(tokens[i:i + n])
        table.best(tokens[i:i + n])
    table.arrays()
    if n == 2:
        ctx = nc.NgramCache()
        ctx.update(tokens[:300])
        for pos in range(2, 300, 5):
            nc.draft(tokens[:pos], N_DRAFT, ctx, None, table)


def test_empty_file(tmp_path):
    (tmp_path / "e.ngst").write_bytes(b"")
    with pytest.raises(CacheFormatError, match="empty file"):
        StaticTable.open(tmp_path / "e.ngst")
    with pytest.raises(CacheFormatError, match="empty file"):
        StaticTable.read_header(tmp_path / "e.ngst")
    with pytest.raises(CacheFormatError, match="empty file"):
        StaticTable.from_bytes(b"")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        StaticTable.open(tmp_path / "nope.ngst")
    with pytest.raises(FileNotFoundError):
        StaticTable.read_header(tmp_path / "nope.ngst")
    with pytest.raises(OSError):
        StaticTable.open(tmp_path)
    with pytest.raises(FileNotFoundError):
        StaticTable.build([1, 2, 3]).save(tmp_path / "no" / "such" / "dir.ngst")


def test_truncated_at_every_boundary_and_many_offsets(tmp_path, table_file):
    data = table_file.read_bytes()
    secs = StaticTable.read_header(table_file)["sections"]
    cuts = {1, 4, 8, 32, 63, 64, 65, len(data) - 64, len(data) - 8, len(data) - 1}
    for off, size in secs.values():
        cuts |= {off, off + 1, off + size - 1, off + size}
    cuts |= set(range(0, len(data), max(1, len(data) // 60)))
    cuts = sorted(c for c in cuts if 0 < c < len(data))
    assert len(cuts) > 50
    p = tmp_path / "cut.ngst"
    for c in cuts:
        p.write_bytes(data[:c])
        with pytest.raises(CacheFormatError, match="truncated|header"):
            StaticTable.open(p)
        with pytest.raises(CacheFormatError):
            StaticTable.read_header(p)
    p.write_bytes(data + b"\0" * 64)
    with pytest.raises(CacheFormatError, match="trailing data"):
        StaticTable.open(p)


def patched(data: bytes, off: int, new: bytes) -> bytes:
    return data[:off] + new + data[off + len(new):]


@pytest.mark.parametrize("off,new,reason", [
    (0, b"NGSX", "bad magic"),
    (0, b"\x00\x00\x00\x00", "bad magic"),
    (4, b"\x02\x00", "unsupported format version 2"),
    (4, b"\x00\x00", "unsupported format version 0"),
    (6, b"\xfe\xff", "big-endian"),
    (6, b"\x00\x00", "byte-order mark"),
])
def test_bad_header_fields(tmp_path, table_file, off, new, reason):
    p = tmp_path / "h.ngst"
    p.write_bytes(patched(table_file.read_bytes(), off, new))
    with pytest.raises(CacheFormatError, match=reason):
        StaticTable.open(p)
    with pytest.raises(CacheFormatError, match=reason):
        StaticTable.read_header(p)


def test_a_lookup_bin_is_not_opened_as_a_table(vectors_dir):
    with pytest.raises(CacheFormatError, match="from_llama"):
        StaticTable.open(vectors_dir / "static-small.lcs.bin")


def test_every_header_byte_is_checked(table_file):
    """Flipping any bit of the header fails at open (magic/version/bom or header check)."""
    data = table_file.read_bytes()
    for off in range(64):
        for bit in (0, 7):
            bad = patched(data, off, bytes([data[off] ^ (1 << bit)]))
            with pytest.raises(CacheFormatError):
                StaticTable.from_bytes(bad)


def test_damage_in_each_section_is_found_by_verify(table_file, small_static):
    """Damage past the header opens (open is O(1)), then verify names the section, and
    using the damaged table unverified never crashes."""
    data = table_file.read_bytes()
    h = StaticTable.read_header(table_file)
    tokens = stdlib_tokens(20_000)
    rng = np.random.default_rng(7)
    for name in ("index", "records", "entries"):
        off, size = h["sections"][name]
        assert size > 0
        for pos in sorted(set(rng.integers(off, off + size, 12).tolist()) | {off, off + size - 1}):
            for flip in (0x01, 0x80, 0xFF):
                t = StaticTable.from_bytes(patched(data, pos, bytes([data[pos] ^ flip])))
                with pytest.raises(CacheFormatError, match=f"checksum mismatch in the {name} section"):
                    t.verify()
                exercise(t, tokens)
    # padding between sections is covered too
    pad = h["sections"]["index"][0] + h["sections"]["index"][1]
    if pad < h["sections"]["records"][0]:
        with pytest.raises(CacheFormatError, match="index section"):
            StaticTable.from_bytes(patched(data, pad, b"\x01")).verify()


def test_garbage_sections_never_read_out_of_bounds(table_file):
    """Whole sections of garbage (huge offsets, unsorted entries): lookups stay in bounds."""
    data = table_file.read_bytes()
    h = StaticTable.read_header(table_file)
    tokens = stdlib_tokens(20_000)
    rng = np.random.default_rng(3)
    for name in ("index", "records", "entries"):
        off, size = h["sections"][name]
        for fill in (b"\xff" * size, b"\x00" * size, rng.integers(0, 256, size, dtype=np.uint8).tobytes(),
                     (b"\xff\xff\xff\x7f\x00\x00\x00\x80" * (size // 8 + 1))[:size]):
            t = StaticTable.from_bytes(patched(data, off, fill))
            with pytest.raises(CacheFormatError):
                t.verify()
            exercise(t, tokens)


def test_verify_checks_structure_not_only_checksums():
    """A file whose checksums are right but whose contents are inconsistent (as a
    buggy writer could make) fails verify with the reason."""
    t = StaticTable.build([1, 2, 3, 1, 2, 3, 1, 2, 4])
    img = bytearray(t.to_bytes())
    h = t.info()
    roff = h["sections"]["records"][0]
    # record fields: u32 begin, u32 sum, i32 best token, u32 best count, key
    rec = next(i for i in range(h["n_keys"])
               if struct.unpack_from("<2i", img, roff + 24 * i + 16) == (1, 2))
    struct.pack_into("<I", img, roff + 24 * rec + 4, 99)  # wrong sum
    fixed = _core_rechecksum(bytes(img))
    with pytest.raises(CacheFormatError, match="stored sum"):
        StaticTable.from_bytes(fixed).verify()


def _core_rechecksum(img: bytes) -> bytes:
    """The image with its checksums recomputed (the core's test hook), so that only the
    structural checks of verify() can catch what was changed."""
    from ngramcache import _core
    return _core._static_rechecksum(img)


def test_random_damage_with_valid_checksums(table_file):
    """Fuzz: random multi-byte damage past the header, checksums then recomputed so that
    only the structural checks can object. verify() passes or raises CacheFormatError;
    lookups and drafts on the unverified table never crash."""
    data = table_file.read_bytes()
    tokens = stdlib_tokens(20_000)
    rng = np.random.default_rng(11)
    rejected = 0
    for _ in range(100):
        img = bytearray(data)
        for pos in rng.integers(64, len(img), rng.integers(1, 6)):
            img[pos] = int(rng.integers(0, 256))
        t = StaticTable.from_bytes(_core_rechecksum(bytes(img)))
        try:
            t.verify()
        except CacheFormatError:
            rejected += 1
        exercise(t, tokens[:3000])
    assert rejected > 60
