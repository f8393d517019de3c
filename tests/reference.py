"""A slow, obviously-correct pure-Python model of llama.cpp's n-gram cache (spec §1).

The oracle the property tests compare ngramcache against. Written for clarity, not
speed: plain dicts, one observation at a time, every rule spelled out where it is used.

A cache is ``dict[tuple[int, ...], dict[int, int]]``: n-gram (1-4 token ids) ->
{next token: count}. Python dicts keep insertion order, which is all the order this
model needs: keys in the order they were first inserted, and each part's tokens in
first-seen order.

Where the project deliberately differs from llama.cpp (design.md §3) the model follows
the project:
- arithmetic is exact (Python ints), llama.cpp uses int32 products;
- an n-gram longer than the sequence is "not found" (llama.cpp reads out of bounds);
- among candidates with an equal score the one first seen latest (inserted last into the
  part) wins; llama.cpp leaves that to libstdc++'s iteration order, which gives the same
  answer for the usual two-candidate tie;
- loading a file keeps each record's pairs in file order as their first-seen order.
"""

from __future__ import annotations

import struct

NGRAM_MAX = 4  # LLAMA_NGRAM_MAX: slots in a key
NGRAM_STATIC = 2  # LLAMA_NGRAM_STATIC
TOKEN_NULL = -1  # LLAMA_TOKEN_NULL

# Threshold tables of common_ngram_cache_draft, indexed by ngram_size - ngram_min.
MIN_SAMPLE_LAX = (2, 2, 1, 1)
MIN_PERCENT_LAX = (66, 50, 50, 50)
MIN_SAMPLE_STRICT = (4, 3, 2, 2)
MIN_PERCENT_STRICT = (75, 66, 66, 66)

Cache = dict  # dict[tuple[int, ...], dict[int, int]]


# --- §1.2 update -------------------------------------------------------------------

def update(cache: Cache, tokens, ngram_min: int = 1, ngram_max: int = 4, nnew: int | None = None) -> None:
    """common_ngram_cache_update: every (n-gram -> next token) observation whose next
    token is one of the last ``nnew`` tokens, sizes ascending in the outer loop."""
    inp = [int(t) for t in tokens]
    if nnew is None:
        nnew = len(inp)
    for size in range(ngram_min, ngram_max + 1):
        i_start = max(len(inp) - nnew, size)
        for i in range(i_start, len(inp)):
            key = tuple(inp[i - size:i])
            token = inp[i]
            part = cache.setdefault(key, {})
            part[token] = part.get(token, 0) + 1


# --- §1.3 draft --------------------------------------------------------------------

def _pick(part: dict, score) -> tuple[int, int]:
    """(token, count) with the highest score; on equal scores the token first seen
    latest, i.e. the one furthest along the part's first-seen order."""
    best_tok, best_cnt, best_score = None, 0, None
    for tok, cnt in part.items():
        s = score(tok, cnt)
        if best_score is None or s >= best_score:  # '>=': a later equal score wins
            best_tok, best_cnt, best_score = tok, cnt, s
    return best_tok, best_cnt


def _try_primary(cache: Cache, seq: list, ngram_min: int, ngram_max: int, part_static: dict,
                 min_sample, min_percent):
    for size in range(ngram_max, ngram_min - 1, -1):  # longest n-gram first
        if size > len(seq):
            continue  # longer than the sequence: not found
        key = tuple(seq[len(seq) - size:])
        if key not in cache:
            continue
        part = cache[key]

        def score(tok, cnt):
            return cnt * (100 * part_static[tok] if tok in part_static else 1)

        tok, cnt = _pick(part, score)
        total = sum(part.values())
        i = size - ngram_min
        if total < min_sample[i]:
            continue
        if 100 * cnt < min_percent[i] * total:
            continue
        return tok
    return None


def _try_static(static: Cache, key: tuple):
    if key not in static:
        return None
    part = static[key]
    tok, cnt = _pick(part, lambda t, c: c)
    total = sum(part.values())
    if total < MIN_SAMPLE_LAX[1]:
        return None
    if 100 * cnt < MIN_PERCENT_LAX[1] * total:
        return None
    return tok


def draft(tokens, n_draft: int, context: Cache, dynamic: Cache | None = None, static: Cache | None = None,
          ngram_min: int = 1, ngram_max: int = 4) -> list[int]:
    """common_ngram_cache_draft with draft = [tokens[-1]]: the drafted continuation."""
    dynamic = {} if dynamic is None else dynamic
    static = {} if static is None else static
    seq = [int(t) for t in tokens]
    if len(seq) < NGRAM_STATIC:
        return []
    out: list[int] = []
    while len(out) < n_draft:
        key_static = tuple(seq[-NGRAM_STATIC:])
        part_static = static.get(key_static, {})
        tok = _try_primary(context, seq, ngram_min, ngram_max, part_static, MIN_SAMPLE_LAX, MIN_PERCENT_LAX)
        if tok is None:
            tok = _try_primary(dynamic, seq, ngram_min, ngram_max, part_static, MIN_SAMPLE_STRICT,
                               MIN_PERCENT_STRICT)
        if tok is None:
            tok = _try_static(static, key_static)
        if tok is None:
            break
        out.append(tok)
        seq.append(tok)  # the virtual sequence inp ++ draft[1:]
    return out


# --- §1.6 merge --------------------------------------------------------------------

def merge(target: Cache, add: Cache) -> None:
    """common_ngram_cache_merge: counts summed; new keys and tokens appended in add's order."""
    for key, part in list(add.items()):  # list(): merging a cache into itself doubles it
        dst = target.setdefault(key, {})
        for tok, cnt in list(part.items()):
            dst[tok] = dst.get(tok, 0) + cnt


# --- §1.4-1.5 lookup.bin -----------------------------------------------------------

def padded(key: tuple) -> tuple:
    return tuple(key) + (TOKEN_NULL,) * (NGRAM_MAX - len(key))


def to_bytes(cache: Cache) -> bytes:
    """lookup.bin image: records in key insertion order, pairs in first-seen order."""
    out = bytearray()
    for key, part in cache.items():
        out += struct.pack("<4i", *padded(key))
        out += struct.pack("<i", len(part))
        for tok, cnt in part.items():
            out += struct.pack("<2i", tok, cnt)
    return bytes(out)


def from_bytes(data: bytes) -> Cache:
    """Parse a valid lookup.bin image. A record's pairs keep their file order as their
    first-seen order; a repeated key or token keeps the first one (as llama.cpp)."""
    cache: Cache = {}
    off = 0
    while off < len(data):
        slots = struct.unpack_from("<4i", data, off)
        (ntokens,) = struct.unpack_from("<i", data, off + 16)
        key = tuple(t for t in slots if t != TOKEN_NULL)
        part: dict = {}
        for j in range(ntokens):
            tok, cnt = struct.unpack_from("<2i", data, off + 20 + 8 * j)
            part.setdefault(tok, cnt)
        cache.setdefault(key, part)
        off += 20 + 8 * ntokens
    return cache


def canonical_bytes(cache: Cache) -> bytes:
    """The canonical form of cache-stats.jsonl: records sorted by key (4 padded slots as
    signed int32, lexicographically), pairs sorted by token, in lookup.bin format."""
    out = bytearray()
    for key in sorted(cache, key=padded):
        part = cache[key]
        out += struct.pack("<4i", *padded(key))
        out += struct.pack("<i", len(part))
        for tok in sorted(part):
            out += struct.pack("<2i", tok, part[tok])
    return bytes(out)
