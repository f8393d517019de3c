"""llama.cpp's ngram-simple, ngram-map-k/k4v and ngram-mod drafters, transcribed in plain
Python from spec/llama-ngram.md §3 with the reference's O(context) scans kept as they are.
Slow on purpose: the oracle the compiled drafters are compared with.

Every class has llama.cpp's calling shape: ``begin(prompt)``, ``draft(prompt, id_last)``
(``prompt`` excludes ``id_last``) and ``accept(n_accepted)``; tokens are lists of ints.
"""

from __future__ import annotations

MAP_SLOTS = 262144        # ngram-map's key_map (2^18 uint32 slots, 0 = empty)
MAP_MAX_VALUES = 4        # value slots per key record of ngram-map-k4v
MAP_COUNT_CAP = 16380     # key_num / value_num saturate here
MOD_SIZE = 4 * 1024 * 1024
MOD_MUL = 6364136223846793005
MASK64 = (1 << 64) - 1


def _eq(seq, a: int, b, n: int) -> bool:
    """seq[a:a+n] == b[:n], the first token checked before slicing."""
    return seq[a] == b[0] and seq[a:a + n] == b[:n]


def simple_draft(tokens: list, sampled: int, size_n: int, size_m: int) -> list:
    """common_ngram_simple_draft: copy what followed the most recent earlier occurrence
    of the last size_n tokens (position 0 never counts)."""
    cur = len(tokens)
    n, m = size_n, size_m
    if cur <= n + m + 1:
        return []
    pattern = tokens[cur - n + 1:cur] + [sampled]
    match = -1
    for j in range(cur - n - 1, 0, -1):
        if _eq(tokens, j, pattern, n):
            match = j
            break
    if match < 0:
        return []
    copy = min(m, cur - (match + n))
    if copy < n:
        return []
    return tokens[match + n:match + n + copy]


class NgramSimple:
    def __init__(self, size_n: int = 12, size_m: int = 48):
        self.n, self.m = size_n, size_m

    def begin(self, prompt) -> None:
        pass

    def draft(self, prompt, id_last: int) -> list:
        return simple_draft(list(prompt), int(id_last), self.n, self.m)

    def accept(self, n_accepted: int) -> None:
        pass


def map_hash(toks) -> int:
    h = 0
    for t in toks:
        h = (h * 2654435761 + t) & 0xFFFFFFFF
    return h % MAP_SLOTS


class _Value:
    __slots__ = ("idx", "num", "n_accepted")

    def __init__(self, idx: int, num: int, n_accepted: int):
        self.idx, self.num, self.n_accepted = idx, num, n_accepted


class _Key:
    __slots__ = ("key_idx", "stat_idx", "key_num", "values")

    def __init__(self, key_idx: int, m: int):
        self.key_idx = key_idx
        self.stat_idx = 0
        self.key_num = 0
        self.values = [_Value(0, 0, m) for _ in range(MAP_MAX_VALUES)]


class NgramMap:
    """common_ngram_map (key_only: ngram-map-k; otherwise ngram-map-k4v)."""

    def __init__(self, size_n: int = 12, size_m: int = 48, min_hits: int = 1, k4v: bool = False):
        self.n, self.m, self.min_hits, self.key_only = size_n, size_m, min_hits, not k4v
        self.keys: list[_Key] = []
        self.key_map: dict[int, int] = {}  # slot -> position (absent = 0)
        self.key_map_last_idx = 0
        self.size_last_begin = 0
        self.idx_last_check = 0
        self.last_draft_created = False
        self.last_key = -1
        self.last_value = -1

    def begin(self, prompt) -> None:
        n, m = self.n, self.m
        size = len(prompt)
        cleanup = self.size_last_begin
        if cleanup > size:
            cleanup = size - n - m if size > n + m else 0
        if size < self.idx_last_check:
            self.key_map = {s: v for s, v in self.key_map.items() if not (v != 0 and v >= cleanup)}
            self.key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
            for i in range(len(self.keys) - 1, -1, -1):
                k = self.keys[i]
                if k.key_idx >= cleanup:
                    del self.keys[i]
                    continue
                if self.key_only:
                    continue
                v = 0
                while v < MAP_MAX_VALUES:
                    if k.values[v].idx != 0 and k.values[v].idx >= cleanup:
                        for w in range(v, MAP_MAX_VALUES - 1):
                            src = k.values[w + 1]
                            k.values[w] = _Value(src.idx, src.num, src.n_accepted)
                        last = k.values[MAP_MAX_VALUES - 1]
                        k.values[MAP_MAX_VALUES - 1] = _Value(0, 0, last.n_accepted)
                    else:
                        v += 1
                if k.values[0].idx == 0:
                    del self.keys[i]
        self.idx_last_check = size
        self.size_last_begin = size

    def draft(self, prompt, id_last: int) -> list:
        inp = list(prompt)
        n, m = self.n, self.m
        self.last_draft_created = False
        cur = len(inp)
        if cur < 2 * n + m:
            return []
        self.idx_last_check = cur
        key = inp[cur - n + 1:cur] + [int(id_last)]
        match = 0
        s = self.key_map.get(map_hash(key), 0)
        if s != 0 and s < cur - n - m - 1 and inp[s:s + n] == key:
            match = s
        slb, kmli = self.size_last_begin, self.key_map_last_idx
        range_a = range(slb - n - m - 1, kmli, -1) if slb > n + m + 1 else range(0)
        range_b = range(cur - n - m - 1, max(slb, kmli), -1)
        if match == 0:
            for j in range_a:
                if _eq(inp, j, key, n):
                    match = j
                    break
        if match == 0:
            for j in range_b:
                if _eq(inp, j, key, n):
                    match = j
                    break
        for rng in (range_a, range_b):
            for j in rng:
                h = map_hash(inp[j:j + n])
                if self.key_map.get(h, 0) == 0:
                    self.key_map[h] = j
        self.key_map_last_idx = max(cur - n - m - 1, kmli)
        if match == 0:
            return []
        ki = -1
        for i, k in enumerate(self.keys):
            if inp[k.key_idx:k.key_idx + n] == key:
                ki = i
                break
        if ki < 0:
            self.keys.append(_Key(match, m))
            ki = len(self.keys) - 1
        rec = self.keys[ki]
        rec.key_num = min(rec.key_num + 1, MAP_COUNT_CAP)
        if self.key_only:
            k = min(m, rec.values[0].n_accepted)
            self.last_draft_created, self.last_key, self.last_value = True, ki, 0
            return inp[match + n:match + n + k]
        if rec.key_num < self.min_hits:
            return []
        for i in range(rec.stat_idx, match + 1):
            if inp[i:i + n] != key:
                continue
            for v in range(MAP_MAX_VALUES):
                val = rec.values[v]
                if val.idx == 0:
                    rec.values[v] = val = _Value(i + n, 0, m)
                elif inp[val.idx:val.idx + m] != inp[i + n:i + n + m]:
                    continue
                val.num = min(val.num + 1, MAP_COUNT_CAP)
                break
        rec.stat_idx = match
        best = 0
        for v in range(1, MAP_MAX_VALUES):
            if rec.values[v].num > rec.values[best].num:
                best = v
        others = sum(rec.values[v].num for v in range(MAP_MAX_VALUES) if v != best)
        if others > 0 and rec.values[best].num < 2 * others:
            return []
        k = min(m, rec.values[best].n_accepted)
        self.last_draft_created, self.last_key, self.last_value = True, ki, best
        return inp[match + n:match + n + k]

    def accept(self, n_accepted: int) -> None:
        if self.last_draft_created:
            self.keys[self.last_key].values[self.last_value].n_accepted = n_accepted


def mod_slot(toks, size: int) -> int:
    r = 0
    for t in toks:
        r = (r * MOD_MUL + t) & MASK64
    return r % size


class ModTable:
    """common_ngram_mod: size int32 slots (absent = -1), last writer wins, no keys."""

    def __init__(self, n: int, size: int = MOD_SIZE):
        self.n, self.size = n, size
        self.entries: dict[int, int] = {}
        self.resets = 0

    @property
    def used(self) -> int:
        return len(self.entries)

    def add(self, toks) -> None:
        self.entries[mod_slot(toks[:self.n], self.size)] = toks[self.n]

    def get(self, toks) -> int:
        return self.entries.get(mod_slot(toks, self.size), -1)

    def reset(self) -> None:
        self.entries.clear()
        self.resets += 1


class NgramMod:
    def __init__(self, n_match: int = 24, n_min: int = 48, n_max: int = 64, table: ModTable | None = None):
        self.n, self.n_min, self.n_max = n_match, n_min, n_max
        self.table = table if table is not None else ModTable(n_match)
        self.i_last = 0
        self.n_draft_last = 0
        self.n_low = 0

    def begin(self, prompt) -> None:
        p = list(prompt)
        n = self.n
        self.i_last = 0
        self.n_draft_last = 0
        if len(p) < n:
            return
        for i in range(len(p) - n):
            self.table.add(p[i:i + n + 1])
        self.i_last = len(p) - n
        if self.table.used / self.table.size > 0.25:
            self.table.reset()

    def draft(self, prompt, id_last: int) -> list:
        p = list(prompt)
        n = self.n
        self.n_draft_last = 0
        cur = len(p)
        if cur < n:
            return []
        if self.i_last + 32 < cur:
            for i in range(self.i_last, cur - n):
                self.table.add(p[i:i + n + 1])
            self.i_last = cur - n
        w = p[cur - n + 1:cur] + [int(id_last)]
        out: list = []
        for i in range(self.n_max):
            tok = self.table.get(w[len(w) - n:])
            if tok == -1:
                if i < self.n_min:
                    return []
                break
            out.append(tok)
            w.append(tok)
        self.n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int) -> None:
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < 0.25:
                self.n_low += 1
                if self.n_low >= 5:
                    self.table.reset()
                    self.n_low = 0
                    self.i_last = 0
            else:
                self.n_low = 0


def drive(drafter, stream, begin_at: int | None = 512, n_pos: int | None = None):
    """The vectors' driver loop (vectors/drafters/README.md): a draft at every position
    pos = 1..N with prompt = stream[:pos-1] and id_last = stream[pos-1]; begin once with
    stream[:begin_at] right before the draft at pos = begin_at + 1; accept after every
    non-empty draft with the accepted prefix length. Yields (pos, draft, n_accepted)."""
    stream = list(stream)
    n_total = len(stream) if n_pos is None else n_pos
    for pos in range(1, n_total + 1):
        ctx = stream[:pos - 1]
        if begin_at is not None and pos == begin_at + 1:
            drafter.begin(ctx)
        d = [int(t) for t in drafter.draft(ctx, stream[pos - 1])]
        acc = 0
        while acc < len(d) and pos + acc < len(stream) and stream[pos + acc] == d[acc]:
            acc += 1
        if d:
            drafter.accept(acc)
        yield pos, d, acc
