"""Argument validation for every public entry point: tokens are converted here, once,
and integer arguments are checked here, so every error names the argument the same way."""

from __future__ import annotations

import numpy as np

INT32_MAX = 2**31 - 1
NGRAM_MAX = 4  # llama.cpp's LLAMA_NGRAM_MAX: the longest key
# Up to this many ids, Python's min() of a list beats numpy's reduction, whose fixed cost
# (about 2 us) would dominate the per-token validation of a drafting step.
_SMALL = 16
_MASKED = np.ma.MaskedArray


def _min(arr: np.ndarray):
    return min(arr.tolist()) if arr.size <= _SMALL else arr.min()


def as_tokens(tokens, name: str = "tokens") -> np.ndarray:
    """Return `tokens` as a 1-D C-contiguous int32 array, or raise ValueError.

    Accepts any 1-D integer sequence or array. Rejects floats, booleans, strings,
    multi-dimensional input, negative ids and values beyond int32.
    """
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 and tokens.ndim == 1 and not isinstance(tokens, _MASKED):
        arr = tokens
    else:
        if isinstance(tokens, (str, bytes, bytearray, memoryview)):
            raise ValueError(f"{name}: expected a sequence of integer token ids, got {type(tokens).__name__}")
        if isinstance(tokens, _MASKED):  # its mask would be ignored silently
            raise ValueError(f"{name}: a masked array is not a token sequence; use .compressed() or .filled(...)")
        try:
            arr = np.asarray(tokens)
        except (ValueError, TypeError) as e:  # ragged nested lists and the like
            raise ValueError(f"{name}: expected a 1-D sequence of integer token ids ({e})") from None
        if arr.ndim != 1:
            if arr.ndim == 0:
                raise ValueError(f"{name}: expected a 1-D sequence of token ids, got a scalar")
            raise ValueError(f"{name}: expected a 1-D sequence of token ids, got shape {arr.shape}")
        if arr.size == 0:
            return np.zeros(0, dtype=np.int32)
        if arr.dtype.kind not in "iu":  # not issubdtype(np.integer): timedelta64 is one
            if not isinstance(tokens, np.ndarray):
                _name_bad_element(tokens, name)  # Python ints beyond int64 land here too
            raise ValueError(f"{name}: token ids must be integers, got dtype {arr.dtype}")
        if arr.dtype != np.int32:
            lo, hi = arr.min(), arr.max()
            if hi > INT32_MAX:
                i = int(np.argmax(arr > INT32_MAX))
                raise ValueError(f"{name}: token id {arr[i]} at index {i} is beyond the int32 range")
            if lo < 0:
                i = int(np.argmax(arr < 0))
                raise ValueError(f"{name}: negative token id {arr[i]} at index {i}")
            arr = arr.astype(np.int32)
    if arr.size and _min(arr) < 0:
        i = int(np.argmax(arr < 0))
        raise ValueError(f"{name}: negative token id {arr[i]} at index {i}")
    return np.ascontiguousarray(arr)


def tail(tokens, n: int):
    """The last ``n`` elements of a sequence when it can be sliced, else the sequence
    itself: lets an O(1) operation validate O(1) tokens, however long the sequence."""
    if hasattr(tokens, "__len__") and not isinstance(tokens, (str, bytes)) and len(tokens) > n:
        try:
            return tokens[len(tokens) - n:]
        except TypeError:  # a sequence without slicing (deque): validated whole
            pass
    return tokens


_INT32 = np.dtype(np.int32)


def tail_tokens(tokens, n: int, name: str = "tokens") -> np.ndarray:
    """``as_tokens(tail(tokens, n))``, with a short path for what drafting loops pass at
    every step (a 1-D int32 array): a view of its last ``n`` ids, checked in one call."""
    if type(tokens) is np.ndarray and tokens.dtype is _INT32 and tokens.ndim == 1:
        t = tokens[-n:] if tokens.shape[0] > n else tokens
        if t.flags.c_contiguous and (t.shape[0] == 0 or min(t.tolist()) >= 0):
            return t
    return as_tokens(tail(tokens, n), name)


def _name_bad_element(seq, name: str) -> None:
    """numpy turns Python ints beyond int64 into object or float64 arrays; name the first
    element that is not a valid token id instead of blaming the dtype."""
    for i, v in enumerate(seq):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name}: token ids must be integers, got {type(v).__name__} {v!r} at index {i}")
        if v < 0:
            raise ValueError(f"{name}: negative token id {v} at index {i}")
        if v > INT32_MAX:
            raise ValueError(f"{name}: token id {v} at index {i} is beyond the int32 range")


def check_int(name: str, value, lo: int | None = None, hi: int | None = None, *,
              none_ok: bool = False) -> int | None:
    """``value`` as an int, or ValueError naming ``name``: it must be an integer (not a
    bool, not a float) within ``lo..hi`` (either bound may be None). ``none_ok`` lets
    None through."""
    if type(value) is not int:  # plain ints (the usual case) skip the slower checks
        if value is None and none_ok:
            return None
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            kind = "an integer or None" if none_ok else "an integer"
            raise ValueError(f"{name} must be {kind}, got {type(value).__name__}")
    if lo is not None and hi is not None and not lo <= value <= hi:
        raise ValueError(f"{name} must be {lo} to {hi}, got {value}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")
    return int(value)


def check_ngram_sizes(ngram_min, ngram_max) -> tuple[int, int]:
    """The n-gram size range of an update or a draft: 1 <= ngram_min <= ngram_max <= 4."""
    if type(ngram_min) is int and type(ngram_max) is int and 1 <= ngram_min <= ngram_max <= NGRAM_MAX:
        return ngram_min, ngram_max
    ok = all(not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, np.integer)) for v in (ngram_min, ngram_max))
    if not ok or not (1 <= ngram_min <= ngram_max <= NGRAM_MAX):
        raise ValueError(f"need 1 <= ngram_min <= ngram_max <= {NGRAM_MAX}, got ngram_min={ngram_min}, "
                         f"ngram_max={ngram_max}")
    return int(ngram_min), int(ngram_max)
