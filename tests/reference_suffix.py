"""A slow model of SuffixDrafter and SuffixStore: every proposal rescans each earlier
position of the request and of the stored requests (the rule of docs/drafters.md)."""

from __future__ import annotations


def side(texts: list[list[int]], seq: list[int], dc: int, alpha: float, min_prob: float, n_max: int):
    """(match length, tokens, score) proposed from ``texts`` (in the order they were
    seen) for the sequence ``seq``, contexts of at most ``dc`` tokens."""

    def follows(x):
        # token -> [count, stamp of the newest occurrence]
        cnt: dict[int, list[int]] = {}
        base = 0
        k = len(x)
        for s in texts:
            for e in range(k - 1, len(s) - 1):
                if s[e - k + 1 : e + 1] == x:
                    c = cnt.setdefault(s[e + 1], [0, 0])
                    c[0] += 1
                    c[1] = base + e + 1
            base += len(s)
        return cnt

    m = 0
    for length in range(min(dc, len(seq)), 0, -1):
        if follows(seq[-length:]):
            m = length
            break
    if m == 0:
        return 0, [], 0.0
    x = seq[-m:]
    cap = alpha * m
    limit = n_max if cap >= n_max else int(cap)
    p, score, out = 1.0, 0.0, []
    while len(out) < limit:
        cnt = follows(x)
        if not cnt:
            break
        total = sum(c[0] for c in cnt.values())
        best = max(cnt, key=lambda t: (cnt[t][0], cnt[t][1]))
        p *= cnt[best][0] / total
        if p < min_prob:
            break
        out.append(best)
        score += p
        x = (x + [best])[-dc:]
    return m, out, score


class RefStore:
    def __init__(self, max_tokens: int = 1_000_000, max_depth: int = 64):
        self.max_tokens = max_tokens
        self.max_depth = max_depth
        self.reqs: list[list[int]] = []

    @property
    def n_tokens(self) -> int:
        return sum(map(len, self.reqs))

    def add(self, tokens) -> None:
        t = [int(x) for x in tokens]
        if not t or len(t) > self.max_tokens:
            return
        while self.reqs and self.n_tokens + len(t) > self.max_tokens:
            self.reqs.pop(0)
        self.reqs.append(t)


class RefSuffixDrafter:
    def __init__(self, n_draft=16, max_depth=64, alpha=4.0, min_prob=0.1, store: RefStore | None = None):
        self.n_draft, self.max_depth, self.alpha, self.min_prob, self.store = n_draft, max_depth, alpha, min_prob, store
        self.seq: list[int] = []
        self.confidence = 0

    def reset(self, prompt) -> None:
        self.finish()
        self.seq = [int(x) for x in prompt]

    def finish(self) -> None:
        if self.store is not None and self.seq:
            self.store.add(self.seq)
        self.seq = []

    def accept(self, tokens) -> None:
        self.seq += [int(x) for x in tokens]

    def propose(self, n_max=None) -> list[int]:
        n = self.n_draft if n_max is None else min(n_max, self.n_draft)
        self.confidence = 0
        if n == 0 or not self.seq:
            return []
        ma, a, sa = side([self.seq], self.seq, self.max_depth, self.alpha, self.min_prob, n)
        if self.store is not None:
            dc = min(self.max_depth, self.store.max_depth)
            mb, b, sb = side(self.store.reqs, self.seq, dc, self.alpha, self.min_prob, n)
            if b and (not a or mb > ma or (mb == ma and sb > sa)):
                self.confidence = mb
                return b
        self.confidence = ma if a else 0
        return a
