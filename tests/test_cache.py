"""NgramCache: update, get, merge, clear, arrays, save/load and to_bytes/from_bytes, exactly as
the pure-Python model (tests/reference.py), order included; argument errors; damaged
lookup.bin files raise CacheFormatError with the byte offset; save is atomic; counts never
wrap; concurrent updates, drafts and merges are safe.

Random streams use tiny vocabularies (2-6 symbols) so that n-grams repeat, parts get
several candidates and ties are frequent. The symbols are arbitrary int32 ids (0 and
INT32_MAX included) so nothing depends on small ids. Real streams are slices of the PROSE
vectors.

"Exactly" includes order: keys in insertion order and each part in first-seen order,
because that order decides ties when drafting and is what save() writes.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ngramcache as nc
import reference as ref
from conftest import (FAST, INT32_MAX, SLOW, alphabets, as_list, assert_same, build, image, records, size_ranges,
                      streams)


# --- update, get, len, items, arrays ---------------------------------------------------

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
    model = build(tokens, *sizes)[1]
    assert as_list(ours) == as_list(model)
    # Like an unordered_map's clear(), the bucket count stays: a save lists the records as
    # llama.cpp's cleared-and-refilled map would, the same records as a fresh one's.
    assert ref.canonical_bytes(ref.from_bytes(ours.to_bytes())) == ref.canonical_bytes(model)


# --- arguments -------------------------------------------------------------------------

def test_negative_nnew(cache):
    with pytest.raises(ValueError, match="nnew"):
        cache.update([1, 2, 3], nnew=-1)


@pytest.mark.parametrize("size", [0, 5, 8])
def test_get_needs_one_to_four_tokens(cache, size):
    with pytest.raises(ValueError, match="1 to 4"):
        cache.get(list(range(size)))


# --- merge -----------------------------------------------------------------------------

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
    model: dict = {}
    ref.merge(model, src[1])  # keys in llama.cpp's order of src, each part copied as it is
    assert_same(dst, model)


# --- save / load -----------------------------------------------------------------------

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
    # Loading inserts in file order, which is llama.cpp's iteration order of the saved cache:
    # the same contents, in the order llama.cpp's loader would hold them.
    assert_same(loaded, ref.from_bytes(data))
    assert ref.canonical_bytes(ref.from_bytes(data)) == ref.canonical_bytes(model)


@FAST
@given(data=st.data())
def test_load_keeps_file_order_and_first_duplicates(data):
    alpha = data.draw(alphabets(), label="alphabet")
    img = image(data.draw(records(alpha), label="records"))
    ours, model = nc.NgramCache.from_bytes(img), ref.from_bytes(img)
    assert_same(ours, model)
    # Saving it again writes what llama.cpp's save of that loaded map writes.
    assert ours.to_bytes() == ref.to_bytes(model)


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


# --- real token streams ----------------------------------------------------------------

@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.integers(0, 50000), b=st.integers(0, 50000), n=st.integers(1, 8000))
def test_real_stream_merge_and_roundtrip(prose, a, b, n):
    x, y = build(prose[a:a + n].tolist()), build(prose[b:b + n].tolist(), 2, 3)
    x[0].merge(y[0])
    ref.merge(x[1], y[1])
    assert_same(*x)
    assert_same(nc.NgramCache.from_bytes(x[0].to_bytes()), ref.from_bytes(ref.to_bytes(x[1])))


# --- damaged files ---------------------------------------------------------------------

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


# --- atomic save -----------------------------------------------------------------------

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


# A child that takes CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH out of its capability bounding set
# (Linux's prctl), then runs Python again: the new program, even run by root, has neither power
# and obeys file and directory permissions as any user does. Exit status 4: prctl failed.
DROP_FILE_ACCESS_OVERRIDE = textwrap.dedent("""
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            print(os.strerror(ctypes.get_errno()))
            sys.exit(4)
    os.execv(sys.executable, [sys.executable] + sys.argv[1:])
""")


def _save_without_root_powers(path) -> subprocess.CompletedProcess:
    """Save a cache to ``path`` in a process that cannot override file permissions; exit
    status 0 when the save raised PermissionError, 3 when it succeeded."""
    code = textwrap.dedent("""
        import sys, ngramcache as nc
        c = nc.NgramCache()
        c.update([1, 2, 3, 1, 2])
        try:
            c.save(sys.argv[1])
        except PermissionError as e:
            print(e)
            sys.exit(0)
        sys.exit(3)
    """)
    done = subprocess.run([sys.executable, "-c", DROP_FILE_ACCESS_OVERRIDE, "-c", code, str(path)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode == 4:
        pytest.skip(f"running as root, which ignores directory permissions, and unable to drop that power "
                    f"for a child process (prctl: {done.stdout.strip()})")
    return done


@pytest.mark.skipif(os.name != "posix", reason="POSIX directory permissions")
def test_failed_save_into_read_only_dir(tmp_path, cache):
    """A save into a directory it cannot write raises PermissionError and leaves the old file
    and no temporary file. Root ignores directory permissions: as root the save runs in a child
    process without that power."""
    if os.geteuid() == 0 and not sys.platform.startswith("linux"):
        pytest.skip("running as root, which ignores directory permissions, on a system without prctl")
    path = tmp_path / "c.bin"
    path.write_bytes(GOOD)
    tmp_path.chmod(0o555)
    try:
        if os.geteuid() == 0:
            done = _save_without_root_powers(path)
            assert done.returncode == 0, f"the save did not raise PermissionError: {done.stdout}{done.stderr}"
            assert "Permission denied" in done.stdout
        else:
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


# --- threads ---------------------------------------------------------------------------

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


# --- overflow --------------------------------------------------------------------------

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


# --- a failing change leaves the cache as it was ----------------------------------------

def _near_overflow() -> nc.NgramCache:
    """(1,) -> {2: 1} and (3,) -> {4: INT32_MAX}: the next count of (3,) -> 4 overflows."""
    return nc.NgramCache.from_bytes(rec((1,), [(2, 1)]) + rec((3,), [(4, INT32_MAX)]))


@pytest.mark.parametrize("change", [
    lambda c: c.merge(c),                         # doubling: (1,) would become {2: 2} first
    lambda c: c.merge(_near_overflow()),
    lambda c: c.update([1, 2, 3, 4]),             # (1,) -> 2 is counted before (3,) -> 4
    lambda c: c.update([1, 2, 3, 4], 1, 1, nnew=3),
])
def test_an_overflowing_change_changes_nothing(change):
    cache = _near_overflow()
    before = cache.to_bytes()
    with pytest.raises(OverflowError, match="int32"):
        change(cache)
    assert cache.to_bytes() == before
    cache.update([1, 2])  # still usable, and counts where it did not overflow
    assert cache.get([1]) == {2: 2}


def test_counts_up_to_the_limit_are_fine():
    cache = nc.NgramCache.from_bytes(rec((3,), [(4, INT32_MAX - 2)]))
    cache.update([3, 4, 3, 4], 1, 1)          # two more: exactly INT32_MAX
    assert cache.get([3]) == {4: INT32_MAX}
    other = nc.NgramCache.from_bytes(rec((3,), [(5, INT32_MAX)]))
    cache.merge(other)                         # a different token: no sum overflows
    assert cache.get([3]) == {4: INT32_MAX, 5: INT32_MAX}


def test_a_huge_nnew_means_every_token():
    a, b = nc.NgramCache(), nc.NgramCache()
    a.update([1, 2, 3, 4, 5], nnew=10**20)
    b.update([1, 2, 3, 4, 5])
    assert a.to_bytes() == b.to_bytes()


# --- a memory cap for caches that live long -----------------------------------------------

MiB = 1 << 20


@FAST
@given(tokens=streams(max_len=300), sizes=size_ranges(), chunk=st.integers(1, 50))
def test_a_cap_never_reached_changes_nothing(tokens, sizes, chunk):
    capped, free = nc.NgramCache(max_bytes=4 * MiB), nc.NgramCache()
    for a in range(0, len(tokens), chunk):
        for c in (capped, free):
            c.update(tokens[:a + chunk], *sizes, nnew=min(chunk, len(tokens) - a))
    capped.merge(free)
    free.merge(free)
    assert capped.evicted == 0
    assert capped.to_bytes() == free.to_bytes()
    assert as_list(capped) == as_list(free)


@pytest.mark.parametrize("bad", [1, MiB - 1, -1, 1.5, True, "1M"])
def test_a_cap_below_a_mebibyte_or_not_an_integer_is_refused(bad):
    with pytest.raises(ValueError, match="max_bytes"):
        nc.NgramCache(max_bytes=bad)


def test_the_cap_forgets_what_was_least_recently_counted():
    rng = np.random.default_rng(1)
    cache = nc.NgramCache(max_bytes=2 * MiB)
    old = rng.integers(0, 10**6, 2000).astype(np.int32)           # about 8000 keys, fits
    cache.update(old)
    assert cache.evicted == 0
    kept, dropped = old[:500], old[1000:]         # kept and one step of the flood fit together
    flood = rng.integers(10**6, 2 * 10**6, 200_000).astype(np.int32)
    for a in range(0, flood.size, 1000):
        cache.update(kept)                  # recounted all along: recently used
        cache.update(flood[a:a + 1000])
        assert cache.estimated_bytes <= cache.max_bytes
    assert cache.evicted > 0
    assert cache.get(kept[:4]) != {}
    assert all(cache.get(dropped[i:i + 2]) == {} for i in range(0, 900, 50))
    # what is kept keeps its counts: the recounted 4-gram was counted at every step
    assert cache.get(kept[:4]) == {int(kept[4]): 1 + flood.size // 1000}


def test_setting_a_cap_on_a_full_cache_evicts_the_oldest_first():
    cache = nc.NgramCache()
    rng = np.random.default_rng(2)
    first, second = (rng.integers(k * 10**6, (k + 1) * 10**6, 30_000).astype(np.int32) for k in (0, 1))
    cache.update(first)
    cache.update(second)
    assert cache.nbytes > 2 * MiB
    cache.max_bytes = 2 * MiB
    assert 0 < cache.evicted < len(cache) + cache.evicted
    assert cache.estimated_bytes <= 2 * MiB
    # keys count as used in insertion order: the 4-grams, inserted last, of the second part
    assert cache.get(second[-5:-1]) == {int(second[-1]): 1} and cache.get(first[:2]) == {}
    cache.max_bytes = None                   # lifting the cap keeps what is left
    assert cache.max_bytes is None and len(cache) > 0


_BOUNDED_MEMORY_SCRIPT = """
import numpy as np, ngramcache as nc, sys
cap = int(sys.argv[1])
rng = np.random.default_rng(0)
tokens = (rng.zipf(1.3, 10_000_000) % 50_000).astype(np.int32)   # 10 M tokens, a text-like law


def rss(field):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(field))


cache = nc.NgramCache(max_bytes=cap)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")                                   # resets the peak (VmHWM) to now
base = rss("VmRSS:")
cache.update(tokens[:5_000_000])                   # one long update
for a in range(5_000_000, tokens.size, 100_000):   # and a stream of short ones
    cache.update(tokens[:a + 100_000], nnew=100_000)
print("peak_growth", rss("VmHWM:") - base)
print("estimated", cache.estimated_bytes)
print("evicted", cache.evicted)
print("keys", len(cache))
unbounded = nc.NgramCache()                        # last: its freed memory would hide growth
unbounded.update(tokens[:1_000_000])
print("unbounded_1m", unbounded.nbytes)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="AddressSanitizer's shadow memory and quarantine are not the cache's")
def test_ten_million_tokens_stay_within_the_cap():
    cap = 48 * MiB
    r = subprocess.run([sys.executable, "-c", _BOUNDED_MEMORY_SCRIPT, str(cap)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    got = {k: int(v) for k, v in (line.split() for line in r.stdout.split("\n") if line)}
    assert got["unbounded_1m"] > 2 * cap          # a tenth of the stream alone would not fit
    assert got["evicted"] > 0 and got["keys"] > 10_000
    assert got["estimated"] <= cap
    # The process: the cap plus the allocator's slack (freed blocks it keeps for reuse).
    assert got["peak_growth"] <= cap * 1.1 + 4 * MiB, got
