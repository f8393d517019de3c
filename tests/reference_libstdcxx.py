"""A pure-Python model of the iteration order of libstdc++'s std::unordered_map.

llama.cpp keeps its n-gram caches in ``std::unordered_map`` and lets the iteration order
break ties when drafting (and decide the record and pair order of a saved lookup.bin).
This model reproduces that order from the insertion sequence; test_libstdcxx_order.py
checks it against real maps compiled with the machine's g++. The rules, from libstdc++'s
``_Hashtable`` with unique keys and ``_Prime_rehash_policy``:

- all nodes sit in one singly linked list; iteration walks it;
- bucket = hash code mod bucket count; a node whose bucket is empty goes to the front of
  the list, otherwise right after the node before its bucket's run (the run's front);
- a default-constructed map has one bucket and allocates 13 on its first insertion;
  when one more node would exceed the bucket count (max load factor 1) it rehashes to
  the first prime of libstdc++'s table that is at least twice the count, walking the old
  list in order and relinking each node by the rule above;
- ``clear()`` keeps the bucket count (so a cleared map regrows from where it was), and
  a copy keeps bucket count and list.
"""

from __future__ import annotations

# The bucket counts a map passes through when it grows one insertion at a time.
BUCKET_CHAIN = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229,
                172933, 351061, 712697, 1447153, 2938679, 5967347, 12117689)

_FIB = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def token_hash(token: int) -> int:
    """std::hash<int32_t>: the value, as a 64-bit size_t (negative ids sign-extend)."""
    return token & _MASK64


def llama_ngram_hash(key: tuple) -> int:
    """common_ngram_hash_function: XOR of Fibonacci hashing over the 4 padded slots."""
    slots = tuple(key) + (-1,) * (4 - len(key))
    h = 0
    for t in slots:
        h ^= (token_hash(t) * _FIB) & _MASK64
    return h


class NodeOrder:
    """The node list of one map; nodes are numbered 0, 1, ... in insertion order."""

    _BEGIN = -1  # "the node before the run is the list head"

    def __init__(self, start_buckets: int = 0):
        self.hashes: list[int] = []
        self.next: list[int | None] = []
        self.head: int | None = None
        self.buckets = 1
        self.next_resize = 0
        self.before: dict[int, int] = {}  # bucket -> node before its run (or _BEGIN)
        if start_buckets:
            self.buckets = self.next_resize = start_buckets

    def _after(self, before: int) -> int | None:
        return self.head if before == self._BEGIN else self.next[before]

    def _set_after(self, before: int, node: int | None) -> None:
        if before == self._BEGIN:
            self.head = node
        else:
            self.next[before] = node

    def _bucket(self, node: int) -> int:
        return self.hashes[node] % self.buckets

    def _link(self, node: int) -> None:
        b = self._bucket(node)
        if b in self.before:
            before = self.before[b]
            self.next[node] = self._after(before)
            self._set_after(before, node)
            return
        self.next[node] = self.head
        self.head = node
        if self.next[node] is not None:
            self.before[self._bucket(self.next[node])] = node
        self.before[b] = self._BEGIN

    def _rehash(self) -> None:
        if self.next_resize == 0:
            n = BUCKET_CHAIN[0]
        else:
            n = BUCKET_CHAIN[BUCKET_CHAIN.index(self.buckets) + 1]
        walk = self.order()
        self.buckets = self.next_resize = n
        self.before = {}
        self.head = None
        for node in walk:  # the old list, in order, relinked by the insertion rule
            self._link(node)

    def insert(self, hash_code: int) -> None:
        if len(self.hashes) + 1 > self.next_resize:
            self._rehash()
        self.hashes.append(hash_code)
        self.next.append(None)
        self._link(len(self.hashes) - 1)

    def order(self) -> list[int]:
        out = []
        p = self.head
        while p is not None:
            out.append(p)
            p = self.next[p]
        return out


def part_order(tokens) -> list[int]:
    """Indices of ``tokens`` (distinct, in insertion order) in an unordered_map<int32_t, V>'s
    iteration order."""
    m = NodeOrder()
    for t in tokens:
        m.insert(token_hash(int(t)))
    return m.order()


def iterate(part: dict) -> list:
    """The (token, count) pairs of a part (a dict in insertion order) in the order
    llama.cpp's map of it visits them."""
    items = list(part.items())
    return [items[i] for i in part_order([t for t, _ in items])]


def key_order(keys) -> list[int]:
    """Indices of n-gram ``keys`` (in insertion order) in llama.cpp's outer map order."""
    m = NodeOrder()
    for k in keys:
        m.insert(llama_ngram_hash(k))
    return m.order()
