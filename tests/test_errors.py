"""Every error of issue 2 §4: bad input raises a clear Python exception, never a crash;
damaged files raise CacheFormatError with the byte offset; save is atomic; concurrent
drafting while another thread updates is safe."""

from __future__ import annotations

import array
import collections
import os
import struct
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import ngramcache as nc
import reference as ref

INT32_MAX = 2**31 - 1


@pytest.fixture
def cache():
    c = nc.NgramCache()
    c.update([1, 2, 3, 1, 2, 3, 1, 2])
    return c


# Each entry point that takes tokens, as a function of the bad tokens.
def _update(c, t):
    c.update(t)


def _draft(c, t):
    nc.draft(t, 4, c)


def _get(c, t):
    c.get(t)


ENTRY_POINTS = [_update, _draft, _get]


# --- tokens ------------------------------------------------------------------------

@pytest.mark.parametrize("call", ENTRY_POINTS)
@pytest.mark.parametrize("bad", [[1, -2, 3], np.array([1, -2], dtype=np.int32), np.array([-5], dtype=np.int64),
                                 [-(2**70)]])
def test_negative_token_ids(cache, call, bad):
    with pytest.raises(ValueError, match="negative"):
        call(cache, bad)


@pytest.mark.parametrize("call", ENTRY_POINTS)
@pytest.mark.parametrize("bad", [[2**31], [1, 2**31], np.array([2**31], dtype=np.int64),
                                 np.array([2**32], dtype=np.uint64), [1, 2**63], [2**64], [1, 2**70]])
def test_values_beyond_int32(cache, call, bad):
    with pytest.raises(ValueError, match="int32"):
        call(cache, bad)


@pytest.mark.parametrize("call", ENTRY_POINTS)
@pytest.mark.parametrize("bad", [[1.0, 2.0], [1, 2.5], np.array([1, 2], dtype=np.float32), [True, False],
                                 np.array([1, 0], dtype=bool), ["1", "2"], [object()], [1, None]])
def test_non_integer_tokens(cache, call, bad):
    with pytest.raises(ValueError, match="integer"):
        call(cache, bad)


@pytest.mark.parametrize("call", ENTRY_POINTS)
@pytest.mark.parametrize("bad", ["abc", b"abc"])
def test_strings_are_not_token_sequences(cache, call, bad):
    with pytest.raises(ValueError, match="integer token ids"):
        call(cache, bad)


@pytest.mark.parametrize("call", ENTRY_POINTS)
@pytest.mark.parametrize("bad", [[[1, 2], [3, 4]], np.zeros((2, 2), dtype=np.int32), [[1, 2], [3]], 5,
                                 np.int32(5)])
def test_multi_dimensional_or_scalar_tokens(cache, call, bad):
    with pytest.raises(ValueError, match="1-D"):
        call(cache, bad)


def test_valid_edge_tokens_are_accepted(cache):
    """The boundaries themselves are fine: 0, INT32_MAX, other integer dtypes, views."""
    c = nc.NgramCache()
    c.update([0, INT32_MAX, 0, INT32_MAX])
    assert c.get([0]) == {INT32_MAX: 2}
    c.update(np.array([7, 8, 7, 8], dtype=np.uint8))
    c.update(np.arange(20, dtype=np.int64)[::2])
    assert c.get([2]) == {4: 1}
    assert nc.draft(np.array([0, INT32_MAX, 0], dtype=np.int64), 2, c).dtype == np.int32


@pytest.mark.parametrize("kind", [list, tuple, collections.deque, lambda x: array.array("i", x),
                                  lambda x: array.array("q", x), lambda x: np.array(x, dtype=np.int64),
                                  lambda x: np.array(x, dtype=np.uint16)])
def test_any_one_dimensional_integer_sequence(kind):
    """Every entry point takes any 1-D integer sequence, sliceable or not, with the same
    result as a list (update with nnew and draft only look at the newest tokens)."""
    seq = [5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6]
    want, got = nc.NgramCache(), nc.NgramCache()
    for n in range(1, len(seq) + 1):
        want.update(seq[:n], nnew=1)
        got.update(kind(seq[:n]), nnew=1)
    got.update(kind(seq), 2, 3)
    want.update(seq, 2, 3)
    assert list(got.items()) == list(want.items())
    assert nc.draft(kind(seq), 5, got).tolist() == nc.draft(seq, 5, want).tolist() == [7, 5, 6, 7, 5]
    assert got.get(kind(seq[-2:])) == want.get(seq[-2:]) == {7: 6}


# --- sizes and counts --------------------------------------------------------------

@pytest.mark.parametrize("lo,hi", [(3, 2), (0, 2), (1, 5), (0, 0), (5, 5), (-1, 4), (4, 1)])
def test_bad_ngram_sizes(cache, lo, hi):
    with pytest.raises(ValueError, match="ngram_min"):
        cache.update([1, 2, 3], ngram_min=lo, ngram_max=hi)
    with pytest.raises(ValueError, match="ngram_min"):
        nc.draft([1, 2, 3], 4, cache, ngram_min=lo, ngram_max=hi)


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


def test_negative_nnew(cache):
    with pytest.raises(ValueError, match="nnew"):
        cache.update([1, 2, 3], nnew=-1)


@pytest.mark.parametrize("size", [0, 5, 8])
def test_get_needs_one_to_four_tokens(cache, size):
    with pytest.raises(ValueError, match="1 to 4"):
        cache.get(list(range(size)))


def test_wrong_cache_types(cache):
    with pytest.raises(TypeError, match="NgramCache"):
        cache.merge({(1,): {2: 1}})
    with pytest.raises(TypeError, match="context"):
        nc.draft([1, 2], 3, None)
    with pytest.raises(TypeError, match="dynamic"):
        nc.draft([1, 2], 3, cache, dynamic=5)
    with pytest.raises(TypeError, match="static"):
        nc.draft([1, 2], 3, cache, static="x")


# --- damaged files -----------------------------------------------------------------

def rec(key, pairs, ntokens=None) -> bytes:
    return struct.pack("<5i", *ref.padded(key), len(pairs) if ntokens is None else ntokens) + b"".join(
        struct.pack("<2i", t, c) for t, c in pairs)


GOOD = rec((1, 2), [(3, 4), (5, 6)])  # 36 bytes


@pytest.mark.parametrize("data,offset,what", [
    (GOOD[:-8], 0, "truncated"),                               # a pair missing
    (GOOD[:-4], 0, "truncated"),                               # half a pair missing
    (GOOD + GOOD[:20], 36, "truncated"),                       # second record: header only
    (GOOD + GOOD[:16], 36, "truncated"),                       # a lone key
    (GOOD[:12], 0, "truncated"),                               # less than a key
    (GOOD + rec((7,), [(1, 1)], ntokens=2**31 - 1), 36, "truncated"),  # ntokens far beyond the file
    (rec((1,), [], ntokens=0), 16, "ntokens"),
    (GOOD + rec((1,), [(2, 3)], ntokens=-1)[:20] + struct.pack("<2i", 2, 3), 52, "ntokens"),
    (rec((1,), [(2, 0)]), 24, "count"),
    (GOOD + rec((1,), [(2, 1), (3, -5)]), 36 + 32, "count"),
    (GOOD + b"\0", 36, "multiple of 4"),
    (GOOD[:-1], 32, "multiple of 4"),
    (b"\x01\x02\x03", 0, "multiple of 4"),
])
def test_damaged_file(tmp_path, data, offset, what):
    path = tmp_path / "bad.bin"
    path.write_bytes(data)
    for load in (lambda: nc.NgramCache.load(path), lambda: nc.NgramCache.from_bytes(data)):
        with pytest.raises(nc.CacheFormatError, match=what) as e:
            load()
        assert f"byte offset {offset}" in str(e.value)
    with pytest.raises(ValueError):  # CacheFormatError is a ValueError
        nc.NgramCache.load(path)
    assert str(path) in str(pytest.raises(nc.CacheFormatError, nc.NgramCache.load, path).value)


def test_cache_format_error_is_value_error():
    assert issubclass(nc.CacheFormatError, ValueError)


def test_failed_load_leaves_the_cache_untouched(tmp_path):
    path = tmp_path / "bad.bin"
    path.write_bytes(GOOD + GOOD[:-4])
    with pytest.raises(nc.CacheFormatError):
        nc.NgramCache.load(path)
    good = tmp_path / "good.bin"
    good.write_bytes(GOOD)
    assert nc.NgramCache.load(good).get([1, 2]) == {3: 4, 5: 6}


def test_empty_file_is_an_empty_cache(tmp_path):
    (tmp_path / "e.bin").write_bytes(b"")
    assert len(nc.NgramCache.load(tmp_path / "e.bin")) == 0


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        nc.NgramCache.load(tmp_path / "nope.bin")
    with pytest.raises(FileNotFoundError):
        nc.NgramCache().save(tmp_path / "no-such-dir" / "x.bin")


def test_loading_a_directory_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        nc.NgramCache.load(tmp_path)


# --- atomic save -------------------------------------------------------------------

def big_cache(n=20000) -> nc.NgramCache:
    c = nc.NgramCache()
    c.update(np.random.default_rng(0).integers(0, 50, n))
    return c


def test_save_replaces_the_previous_file(tmp_path, cache):
    path = tmp_path / "c.bin"
    path.write_bytes(b"old")
    cache.save(path)
    assert path.read_bytes() == cache.to_bytes()
    assert os.listdir(tmp_path) == ["c.bin"]


def test_failed_save_over_a_directory_keeps_it_and_leaves_no_temp(tmp_path, cache):
    target = tmp_path / "c.bin"
    target.mkdir()
    (target / "inside").write_bytes(b"x")
    with pytest.raises(OSError):
        cache.save(target)
    assert sorted(os.listdir(tmp_path)) == ["c.bin"]
    assert (target / "inside").read_bytes() == b"x"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores directory permissions")
def test_failed_save_into_read_only_dir(tmp_path, cache):
    path = tmp_path / "c.bin"
    path.write_bytes(GOOD)
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(PermissionError):
            cache.save(path)
    finally:
        tmp_path.chmod(0o755)
    assert path.read_bytes() == GOOD
    assert os.listdir(tmp_path) == ["c.bin"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_FSIZE and SIGXFSZ")
def test_save_failing_mid_write_keeps_the_previous_file(tmp_path):
    """A write that fails half-way (file size limit: EFBIG), even for root: the previous
    file is intact and the temporary file is gone."""
    path = tmp_path / "c.bin"
    path.write_bytes(GOOD)
    script = textwrap.dedent(f"""
        import resource, signal, sys
        import numpy as np, ngramcache as nc
        c = nc.NgramCache()
        c.update(np.random.default_rng(0).integers(0, 50, 20000))
        assert len(c.to_bytes()) > 100_000
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            c.save({str(path)!r})
        except OSError as e:
            print("OSError", e)
            sys.exit(0)
        sys.exit("save did not fail")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "OSError" in r.stdout and "c.bin" in r.stdout
    assert path.read_bytes() == GOOD
    assert os.listdir(tmp_path) == ["c.bin"]


# --- threads -----------------------------------------------------------------------

def test_concurrent_drafts_while_updating():
    """Several threads draft from (and read) one cache while another thread updates it
    token by token: no crash, every draft well-formed, final counts exact."""
    rng = np.random.default_rng(1)
    base = rng.integers(0, 5, 3000).astype(np.int32)
    extra = rng.integers(0, 5, 4000).astype(np.int32)
    shared = nc.NgramCache()
    shared.update(base)
    static = nc.NgramCache()
    static.update(base, 2, 2)
    stop = threading.Event()
    errors: list[BaseException] = []
    drafted = [0] * 4

    def reader(k):
        try:
            r = np.random.default_rng(100 + k)
            while not stop.is_set():
                i = int(r.integers(2, base.size))
                d = nc.draft(base[:i], 8, shared, shared, static)
                assert d.dtype == np.int32 and d.size <= 8 and ((d >= 0) & (d < 5)).all()
                drafted[k] += 1
                if k == 0:
                    assert len(shared) > 0 and sum(shared.get([int(base[i - 1])]).values()) > 0
                    shared.arrays()
        except BaseException as e:  # noqa: BLE001 - surface any failure in the main thread
            errors.append(e)

    def writer():
        try:
            seq = np.concatenate([base, extra])
            for n in range(base.size + 1, seq.size + 1):
                shared.update(seq[:n], nnew=1)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            stop.set()

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)] + [threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert all(n > 0 for n in drafted)
    model = {}
    ref.update(model, base.tolist())
    seq = np.concatenate([base, extra]).tolist()
    for n in range(base.size + 1, len(seq) + 1):
        ref.update(model, seq[:n], 1, 4, 1)
    assert [(k, list(p.items())) for k, p in shared.items()] == [(k, list(p.items())) for k, p in model.items()]


def test_concurrent_merges_in_both_directions_do_not_deadlock():
    a, b = big_cache(3000), big_cache(2000)
    errors = []

    def work(x, y):
        try:
            # Interleaved a += b, b += a grows counts like Fibonacci numbers: 12 rounds each
            # stay far below int32 (50 overflowed whenever the threads interleaved).
            for _ in range(12):
                x.merge(y)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t1 = threading.Thread(target=work, args=(a, b))
    t2 = threading.Thread(target=work, args=(b, a))
    t1.start(), t2.start()
    t1.join(timeout=60), t2.join(timeout=60)
    assert not t1.is_alive() and not t2.is_alive() and not errors


def test_counts_beyond_int32_raise_instead_of_wrapping():
    """lookup.bin stores int32 counts; llama.cpp would wrap silently. Here update and merge
    raise OverflowError and the count stays at its last valid value."""
    full = nc.NgramCache.from_bytes(rec((1,), [(2, INT32_MAX)]))
    with pytest.raises(OverflowError, match="int32"):
        full.update([1, 2], 1, 1)
    with pytest.raises(OverflowError, match="int32"):
        full.merge(full)
    other = nc.NgramCache.from_bytes(rec((1,), [(2, 1)]))
    with pytest.raises(OverflowError, match="int32"):
        full.merge(other)
    assert full.get([1]) == {2: INT32_MAX}
    assert nc.NgramCache.from_bytes(full.to_bytes()).get([1]) == {2: INT32_MAX}
