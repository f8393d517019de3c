"""A slow, obviously-correct pure-Python model of llama.cpp's n-gram cache (docs/llama-lookup.md §1-4).

The oracle the property tests compare ngramcache against. Written for clarity, not
speed: plain dicts, one observation at a time, every rule spelled out where it is used.

A cache is ``dict[tuple[int, ...], dict[int, int]]``: n-gram (1-4 token ids) ->
{next token: count}. Python dicts keep insertion order, and llama.cpp's order is a
function of it: its unordered_maps visit a part's tokens, and a saved file lists keys and
pairs, in the order reference_libstdcxx.py works out from the insertion sequence. Ties
(the first best score in that order wins, llama.cpp's strict '>'), merges (tokens of a
part added in that order) and to_bytes follow it.

Where the project deliberately differs from llama.cpp (docs/llama-lookup.md §3) the model follows
the project:
- arithmetic is exact (Python ints), llama.cpp uses int32 products;
- an n-gram longer than the sequence is "not found" unless ``llama_oob`` asks for what
  llama.cpp reads there (it reads out of bounds);
- the model's caches are never cleared (llama.cpp's clear() keeps the bucket count,
  which the core tracks; it changes no draft, only the record order of a later save).
"""

from __future__ import annotations

import struct

from reference_libstdcxx import iterate, key_order

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
    """(token, count) with the highest score: the first of them in llama.cpp's iteration
    order of the part (strict '>')."""
    best_tok, best_cnt, best_score = None, 0, None
    for tok, cnt in iterate(part):
        s = score(tok, cnt)
        if best_score is None or s > best_score:
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


# What llama.cpp reads before the start of a 2- or 3-token sequence (glibc's heap header
# of its draft vector, see docs/parity.md), as (S[-2], S[-1] before a 2-token sequence;
# S[-1] there once one token is drafted and the draft vector has grown into a new buffer;
# S[-1] before a 3-token sequence). These are what it usually reads.
LLAMA_OOB_READS = (0, 33, 33, 0)


def oob_prefix(n_inp: int, reads) -> list[int]:
    """The tokens llama.cpp's keys see before a sequence of n_inp tokens."""
    if not reads:
        return []
    return {2: [reads[0], reads[1]], 3: [reads[3]]}.get(n_inp, [])


def oob_grown(seq: list[int], n_inp: int, n_out: int, reads) -> None:
    """After the first drafted token of a 2-token sequence the slot before it is read from
    the draft vector's new buffer."""
    if reads and n_inp == 2 and n_out == 1:
        seq[-4] = reads[2]


def draft(tokens, n_draft: int, context: Cache, dynamic: Cache | None = None, static: Cache | None = None,
          ngram_min: int = 1, ngram_max: int = 4, llama_oob=False) -> list[int]:
    """common_ngram_cache_draft with draft = [tokens[-1]]: the drafted continuation.
    ``llama_oob``: False (keys before the start are not found), True (LLAMA_OOB_READS) or
    a 4-tuple of reads in that layout."""
    dynamic = {} if dynamic is None else dynamic
    static = {} if static is None else static
    seq = [int(t) for t in tokens]
    n_inp = len(seq)
    if n_inp < NGRAM_STATIC:
        return []
    reads = LLAMA_OOB_READS if llama_oob is True else llama_oob
    seq = oob_prefix(n_inp, reads) + seq
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
        oob_grown(seq, n_inp, len(out), reads)
    return out


# --- §1.6 merge --------------------------------------------------------------------

def merge(target: Cache, add: Cache) -> None:
    """common_ngram_cache_merge: counts summed, add's keys walked in the order llama.cpp's
    outer map of add (built fresh, in add's insertion order) visits them. A key new to the
    target gets a copy of add's part (its order kept); an existing one receives add's
    tokens in the order llama.cpp's map of add's part visits them."""
    keys = list(add)  # a list: merging a cache into itself doubles it
    for key in [keys[i] for i in key_order(keys)]:  # the order llama.cpp's map of add has
        part = add[key]
        if key not in target:
            target[key] = dict(part)
            continue
        dst = target[key]
        for tok, cnt in iterate(part):
            dst[tok] = dst.get(tok, 0) + cnt


# --- §1.4-1.5 lookup.bin -----------------------------------------------------------

def padded(key: tuple) -> tuple:
    return tuple(key) + (TOKEN_NULL,) * (NGRAM_MAX - len(key))


def to_bytes(cache: Cache) -> bytes:
    """lookup.bin image as common_ngram_cache_save writes it: records in the outer map's
    iteration order, pairs in each part's."""
    out = bytearray()
    keys = [k for k, p in cache.items() if p]
    for i in key_order(keys):
        key = keys[i]
        part = cache[key]
        out += struct.pack("<4i", *padded(key))
        out += struct.pack("<i", len(part))
        for tok, cnt in iterate(part):
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
