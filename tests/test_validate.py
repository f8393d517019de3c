"""Token and n-gram size arguments, the same for every entry point that takes them
(NgramCache.update, NgramCache.get, draft): any 1-D integer sequence is accepted, anything
else raises a ValueError naming the problem."""

from __future__ import annotations

import array
import collections

import numpy as np
import pytest

import ngramcache as nc
from conftest import INT32_MAX


# Each entry point that takes tokens, as a function of the bad tokens.
def _update(c, t):
    c.update(t)


def _draft(c, t):
    nc.draft(t, 4, c)


def _get(c, t):
    c.get(t)


ENTRY_POINTS = [_update, _draft, _get]


# --- tokens ----------------------------------------------------------------------------

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
                                 np.array([1, 0], dtype=bool), ["1", "2"], [object()], [1, None],
                                 np.array([1, 2], dtype="timedelta64[s]"),  # numpy counts it as an integer
                                 np.array([1, 2], dtype="datetime64[D]")])
def test_non_integer_tokens(cache, call, bad):
    with pytest.raises(ValueError, match="integer"):
        call(cache, bad)


@pytest.mark.parametrize("call", ENTRY_POINTS)
@pytest.mark.parametrize("bad", ["abc", b"abc", bytearray(b"abc"), memoryview(b"abc")])
def test_strings_are_not_token_sequences(cache, call, bad):
    with pytest.raises(ValueError, match="integer token ids"):
        call(cache, bad)


@pytest.mark.parametrize("call", ENTRY_POINTS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_masked_arrays_are_refused_not_unmasked(cache, call, dtype):
    with pytest.raises(ValueError, match="masked array"):
        call(cache, np.ma.array([1, 2, 3, 4], mask=[0, 1, 0, 0], dtype=dtype))


def test_objects_made_without_init_raise_instead_of_crashing():
    for cls in (nc.NgramCache, nc.StaticTable):
        obj = cls.__new__(cls)
        with pytest.raises(AttributeError, match="_impl"):
            len(obj)
    with pytest.raises(AttributeError, match="_impl"):
        nc.NgramCache.__new__(nc.NgramCache).update([1, 2, 3])


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


# --- n-gram sizes ----------------------------------------------------------------------

@pytest.mark.parametrize("lo,hi", [(3, 2), (0, 2), (1, 5), (0, 0), (5, 5), (-1, 4), (4, 1)])
def test_bad_ngram_sizes(cache, lo, hi):
    with pytest.raises(ValueError, match="ngram_min"):
        cache.update([1, 2, 3], ngram_min=lo, ngram_max=hi)
    with pytest.raises(ValueError, match="ngram_min"):
        nc.draft([1, 2, 3], 4, cache, ngram_min=lo, ngram_max=hi)
