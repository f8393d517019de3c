"""Sorted runs and their streaming merge (ngramcache.corpus.sharded): shards of a token stream
merged into exactly the bytes of the single-process build, caches merged into exactly
the bytes of NgramCache.merge, in both formats."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ngramcache.corpus.sharded as sharded
from ngramcache import NgramCache, StaticTable
from conftest import run_cli
from support import tiny_hf_json  # noqa: F401 (a fixture)
from ngramcache.cli._caches import cache_to_table


def _merge_shards(tmp_path, tokens: np.ndarray, cuts: list[int], fmt: str, n: int = 2) -> bytes:
    """Cut tokens at `cuts`, count each shard into a run, merge them (with the n-grams
    across the cuts) and return the file's bytes."""
    bounds = [0, *sorted(cuts), tokens.size]
    counts = [sharded.shard_counts(r, np.ascontiguousarray(tokens[a:b]), n)
              for r, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    folder = tmp_path / f"runs-{fmt}"
    folder.mkdir(exist_ok=True)
    paths = []
    for c in reversed(counts):  # arrival order must not matter
        p = folder / f"shard-{c.rank}.run"
        p.write_bytes(c.run)
        paths.append(p)
    edge = folder / "edge.run"
    edge.write_bytes(sharded.boundary_run(counts, n))
    out = tmp_path / ("out.ngst" if fmt == "ngst" else "out.bin")
    figures = sharded.merge_runs([*paths, edge], out, fmt, from_tokens=True, ngram_size=n)
    assert figures["total_count"] == max(0, tokens.size - n)
    return out.read_bytes()


def _single_process(tokens: np.ndarray, fmt: str, n: int = 2) -> bytes:
    if fmt == "ngst":
        return StaticTable.build(tokens, n).to_bytes()
    c = NgramCache()
    c.update(tokens, n, n)
    return c.to_bytes()


@st.composite
def sharded_streams(draw):
    # Few distinct tokens: many ties, and keys with more than 13 continuations (llama.cpp's
    # maps rehash there, which reorders them).
    alphabet = draw(st.integers(2, 40))
    tokens = np.array(draw(st.lists(st.integers(0, alphabet - 1), min_size=0, max_size=400)), dtype=np.int32)
    cuts = draw(st.lists(st.integers(0, int(tokens.size)), max_size=8))
    return tokens, cuts


@pytest.mark.parametrize("fmt", ["ngst", "llama"])
@settings(max_examples=150, deadline=None)
@given(case=sharded_streams(), n=st.integers(1, 4))
def test_shards_merge_to_the_single_process_bytes(tmp_path_factory, fmt, case, n):
    tokens, cuts = case
    got = _merge_shards(tmp_path_factory.mktemp("s"), tokens, cuts, fmt, n)
    assert got == _single_process(tokens, fmt, n)


@pytest.mark.parametrize("fmt", ["ngst", "llama"])
def test_shards_of_a_real_stream(tmp_path, prose, fmt):
    """A real token stream in shards, among them empty and one-token shards."""
    tokens = np.ascontiguousarray(prose[:60_000], dtype=np.int32)
    cuts = [0, 1, 1, 2, 999, 1000, 1001, 25_000, 25_001, 59_999, 60_000]
    assert _merge_shards(tmp_path, tokens, cuts, fmt) == _single_process(tokens, fmt)


def test_a_shard_boundary_ngram_is_counted(tmp_path):
    """The 2-grams across a cut come from the shards' edges: without them counts differ."""
    tokens = np.array([5, 6, 7, 5, 6, 8], dtype=np.int32)
    got = _merge_shards(tmp_path, tokens, [2, 4], "ngst")
    table = StaticTable.from_bytes(got)
    assert table.get([5, 6]) == {7: 1, 8: 1} and table.get([6, 7]) == {5: 1} and table.total == 4


# -- merging caches --------------------------------------------------------------------------

@st.composite
def cache_lists(draw):
    alphabet = draw(st.integers(2, 30))
    sizes = draw(st.sampled_from([(2, 2), (1, 3), (1, 4)]))
    caches = []
    for _ in range(draw(st.integers(1, 4))):
        c = NgramCache()
        toks = np.array(draw(st.lists(st.integers(0, alphabet - 1), max_size=300)), dtype=np.int32)
        c.update(toks, *sizes)
        caches.append(c)
    return caches, sizes


@settings(max_examples=120, deadline=None)
@given(case=cache_lists(), as_ngst=st.booleans())
def test_streaming_merge_equals_cache_merge(tmp_path_factory, case, as_ngst):
    caches, sizes = case
    tmp = tmp_path_factory.mktemp("m")
    inputs = []
    for i, c in enumerate(caches):
        if as_ngst and sizes == (2, 2) and i % 2:  # NGST inputs load through to_cache()
            p = tmp / f"in{i}.ngst"
            StaticTable.from_cache(c, 2).save(p)
        else:
            p = tmp / f"in{i}.bin"
            c.save(p)
        inputs.append(p)
    from ngramcache.files import load_counts
    merged = load_counts(inputs[0])
    for p in inputs[1:]:
        merged.merge(load_counts(p))
    out = tmp / "out.bin"
    figures = sharded.merge_cache_files(inputs, out, "llama")
    assert out.read_bytes() == merged.to_bytes()
    keys, _, toks, cnts = merged.arrays()
    assert figures == {"keys": keys.shape[0], "entries": toks.size, "total_count": int(cnts.sum())}
    if len({int(k) for k in (keys >= 0).sum(axis=1)}) <= 1:
        out = tmp / "out.ngst"
        sharded.merge_cache_files(inputs, out, "ngst")
        assert out.read_bytes() == cache_to_table(merged).to_bytes()
    else:
        with pytest.raises(ValueError, match="holds n-grams of one size"):
            sharded.merge_cache_files(inputs, tmp / "out.ngst", "ngst")


def test_damaged_run_is_a_clear_error(tmp_path):
    good = sharded.shard_counts(0, np.arange(10, dtype=np.int32), 2).run
    cases = {"short": good[:20], "truncated": good[:-8], "magic": b"XXXX" + good[4:]}
    for name, data in cases.items():
        p = tmp_path / f"{name}.run"
        p.write_bytes(data)
        with pytest.raises(ValueError, match="not a sorted run"):
            sharded.merge_runs([p], tmp_path / "o.ngst", "ngst", from_tokens=True)
    entries = np.frombuffer(good[32:], dtype=np.uint8).reshape(-1, 40)
    swapped = good[:32] + entries[::-1].tobytes()
    p = tmp_path / "unsorted.run"
    p.write_bytes(swapped)
    with pytest.raises(ValueError, match="out of order"):
        sharded.merge_runs([p], tmp_path / "o.ngst", "ngst", from_tokens=True)
    assert not (tmp_path / "o.ngst").exists()


def test_plan_shards_groups_small_files_and_splits_large_ones(tmp_path):
    sizes = [10, 10, 10, 95, 10, 0]
    files = []
    for i, n in enumerate(sizes):
        f = tmp_path / f"{i}.txt"
        f.write_bytes(b"x" * n)
        files.append(f)
    shards = sharded.plan_shards(files, 25)
    assert [[(p.rsplit("/", 1)[1], k, of) for p, k, of in s.parts] for s in shards] == [
        [("0.txt", 0, 1), ("1.txt", 0, 1), ("2.txt", 0, 1)],
        [("3.txt", 0, 4)], [("3.txt", 1, 4)], [("3.txt", 2, 4)], [("3.txt", 3, 4)],
        [("4.txt", 0, 1), ("5.txt", 0, 1)]]
    assert [s.rank for s in shards] == list(range(6))
    assert sum(s.nbytes for s in shards) == sum(sizes)


# -- the command line, without a cluster ---------------------------------------------------

@pytest.mark.parametrize("flags, msg", [
    (["--workers", "0"], "--workers must be at least 1"),
    (["--workers", "2", "--scheduler", "tcp://h:1"], "not both"),
    (["--workers", "2", "-j", "2"], "every Dask worker tokenizes its own shards"),
    (["--workers", "2", "--save-tokens", "t.i32"], "--save-tokens needs every token"),
    (["--shard-size", "100"], "--shard-size goes with --workers"),
    (["--workers", "2", "--shard-size", "0"], "--shard-size must be at least 1"),
])
def test_create_distributed_usage_errors(tmp_path, capsys, flags, msg):
    (tmp_path / "a.txt").write_text("hello")
    rc, out, err = run_cli(capsys, "create", "--tokenizer", tmp_path / "tok.json", "-f", tmp_path / "a.txt",
                           "-lcs", tmp_path / "o.ngst", *flags)
    assert rc == 2 and msg in err and not (tmp_path / "o.ngst").exists()


def test_create_distributed_with_token_file_is_a_usage_error(tmp_path, capsys):
    rc, out, err = run_cli(capsys, "create", "--tokens", tmp_path / "t.i32", "--workers", "2",
                           "-lcs", tmp_path / "o.ngst")
    assert rc == 2 and "--tokens is counted in this process" in err


def test_without_dask_one_line_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails as if not installed
    (tmp_path / "a.txt").write_text("hello")
    rc, out, err = run_cli(capsys, "create", "--tokenizer", tmp_path / "tok.json", "-f", tmp_path / "a.txt",
                           "-lcs", tmp_path / "o.ngst", "--workers", "2")
    assert rc == 1 and out == ""
    assert err.splitlines() == ["ngramcache create: error: --workers and --scheduler need Dask: "
                                "pip install 'ngramcache[distributed]'"]


def test_tokenize_shard_with_a_tokenizer_json(tmp_path, vectors_dir, tiny_hf_json):
    """Shards' tokens, long files split between shards, are the single-process stream's
    slices (a Hugging Face tokenizer encodes pieces in batches: the same pieces)."""
    from ngramcache.corpus.tokenizers import load_tokenizer, tokenize_files

    text = (vectors_dir / "prose.txt").read_bytes()[:60_000]
    files = []
    for i, (a, b) in enumerate([(0, 2_000), (2_000, 40_000), (40_000, 41_000), (41_000, 60_000)]):
        files.append(tmp_path / f"{i}.txt")
        files[-1].write_bytes(text[a:b])
    tok = load_tokenizer(tokenizer_json=tiny_hf_json)
    whole = tokenize_files(files, tok, jobs=1, piece_bytes=1024)
    shards = sharded.plan_shards(files, 7_000)
    assert max(s.parts[0][2] for s in shards) > 1
    parts = [sharded.tokenize_shard(s, tok, True, 1024) for s in shards]
    assert np.array_equal(np.concatenate(parts), whole)


def test_blocks_shrink_with_many_runs_to_stay_within_the_budget():
    assert sharded.block_entries(1) == sharded.MAX_BLOCK_ENTRIES
    many = sharded.block_entries(1000)
    assert sharded.MIN_BLOCK_ENTRIES < many < sharded.MAX_BLOCK_ENTRIES
    assert 1000 * many * sharded.RUN_ENTRY_BYTES <= sharded.BLOCK_BUDGET_BYTES
    assert sharded.block_entries(10**6) == sharded.MIN_BLOCK_ENTRIES
