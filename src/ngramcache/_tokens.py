"""Token validation: every public entry point converts its tokens here, once."""

from __future__ import annotations

import numpy as np

INT32_MAX = 2**31 - 1


def as_tokens(tokens, name: str = "tokens") -> np.ndarray:
    """Return `tokens` as a 1-D C-contiguous int32 array, or raise ValueError.

    Accepts any 1-D integer sequence or array. Rejects floats, booleans, strings,
    multi-dimensional input, negative ids and values beyond int32.
    """
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 and tokens.ndim == 1:
        arr = tokens
    else:
        if isinstance(tokens, (str, bytes)):
            raise ValueError(f"{name}: expected a sequence of integer token ids, got {type(tokens).__name__}")
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
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
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
    if arr.size and arr.min() < 0:
        i = int(np.argmax(arr < 0))
        raise ValueError(f"{name}: negative token id {arr[i]} at index {i}")
    return np.ascontiguousarray(arr)


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
