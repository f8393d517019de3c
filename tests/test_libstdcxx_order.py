"""The pure-Python model of libstdc++'s unordered_map order (reference_libstdcxx.py)
against real maps: a tiny C++ program, built here with the machine's g++, inserts the same
sequences into std::unordered_map and prints the iteration order. Then the core against
the model, on caches whose parts collide in buckets and rehash.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ngramcache as nc
import reference as ref
import reference_libstdcxx as lib

PROGRAM = r"""
#include <cstdint>
#include <iostream>
#include <string>
#include <unordered_map>
#include <vector>

// llama.cpp's key and hash (common_ngram, common_ngram_hash_function), as the spec states.
struct Key { int32_t t[4]; bool operator==(const Key& o) const {
    for (int i = 0; i < 4; ++i) if (t[i] != o.t[i]) return false; return true; } };
struct KeyHash { size_t operator()(const Key& k) const {
    uint64_t h = 0;
    for (int i = 0; i < 4; ++i) h ^= uint64_t(int64_t(k.t[i])) * 11400714819323198485ull;
    return h; } };

// One request per line: "P n t..." tokens into unordered_map<int32_t, int32_t>;
// "C n t... m u..." n tokens, clear(), m tokens; "K n (4 slots)...": keys into the
// outer map. Prints the visited keys in iteration order.
int main() {
    std::string op;
    while (std::cin >> op) {
        size_t n;
        std::cin >> n;
        if (op == "K") {
            std::unordered_map<Key, int32_t, KeyHash> m;
            for (size_t i = 0; i < n; ++i) { Key k; for (int j = 0; j < 4; ++j) std::cin >> k.t[j]; m.emplace(k, 0); }
            for (auto& kv : m) std::cout << kv.first.t[0] << ',' << kv.first.t[1] << ',' << kv.first.t[2] << ','
                                         << kv.first.t[3] << ' ';
        } else {
            std::unordered_map<int32_t, int32_t> m;
            for (size_t i = 0; i < n; ++i) { int32_t t; std::cin >> t; m.emplace(t, 1); }
            if (op == "C") {
                m.clear();
                std::cin >> n;
                for (size_t i = 0; i < n; ++i) { int32_t t; std::cin >> t; m.emplace(t, 1); }
            }
            std::unordered_map<int32_t, int32_t> copy(m);  // a copy keeps the order
            for (auto& kv : copy) std::cout << kv.first << ' ';
        }
        std::cout << std::endl;
    }
}
"""


@pytest.fixture(scope="module")
def real_map(tmp_path_factory):
    """A function: list of requests -> list of printed orders, from a real unordered_map."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: cannot build the real-map program")
    d = tmp_path_factory.mktemp("libstdcxx")
    (d / "order.cpp").write_text(PROGRAM)
    subprocess.run([gxx, "-O1", "-std=c++17", "-o", str(d / "order"), str(d / "order.cpp")], check=True)

    def run(requests: list[str]) -> list[list[str]]:
        out = subprocess.run([str(d / "order")], input="\n".join(requests) + "\n", capture_output=True,
                             text=True, check=True).stdout
        return [line.split() for line in out.splitlines()]
    return run


def distinct(xs):
    return list(dict.fromkeys(xs))


def model_order(tokens) -> list[str]:
    return [str(tokens[i]) for i in lib.part_order(tokens)]


# Tokens that collide a lot: multiples of the first bucket counts, small ids, huge ids,
# negative ids (sign-extended hash codes).
token_ids = st.one_of(st.integers(0, 40), st.integers(0, 300).map(lambda x: 13 * x),
                      st.integers(0, 200).map(lambda x: 29 * x + 1), st.integers(-2**31, 2**31 - 1))
sequences = st.lists(token_ids, min_size=1, max_size=400).map(distinct)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_bucket_chain_and_big_maps_match(real_map):
    """Sizes across several rehashes, up to 6,000 nodes (past the 5,087-bucket step)."""
    rng = np.random.default_rng(3)
    seqs = [distinct(rng.integers(0, m, n).tolist()) for n, m in
            ((13, 100), (14, 100), (30, 60), (128, 300), (600, 5000), (2400, 10**6), (6000, 10**9))]
    seqs.append(list(range(0, 13 * 200, 13)))  # every node in one bucket until a rehash
    seqs.append(list(range(3000, 0, -1)))
    got = real_map([f"P {len(s)} " + " ".join(map(str, s)) for s in seqs])
    for s, g in zip(seqs, got):
        assert g == model_order(s), len(s)


@SETTINGS
@given(seq=sequences)
def test_part_order_matches_a_real_map(real_map, seq):
    assert real_map([f"P {len(seq)} " + " ".join(map(str, seq))])[0] == model_order(seq)


@SETTINGS
@given(first=sequences, then=sequences)
def test_clear_keeps_the_buckets(real_map, first, then):
    got = real_map([f"C {len(first)} " + " ".join(map(str, first)) + f" {len(then)} " +
                    " ".join(map(str, then))])[0]
    start = lib.BUCKET_CHAIN[next(i for i, b in enumerate(lib.BUCKET_CHAIN) if b >= len(first))]
    m = lib.NodeOrder(start)
    for t in then:
        m.insert(lib.token_hash(t))
    assert got == [str(then[i]) for i in m.order()]


@SETTINGS
@given(keys=st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=4).map(tuple), min_size=1,
                     max_size=300).map(distinct))
def test_outer_map_order_matches_a_real_map(real_map, keys):
    padded = [ref.padded(k) for k in keys]
    got = real_map([f"K {len(keys)} " + " ".join(" ".join(map(str, p)) for p in padded)])[0]
    assert got == [",".join(map(str, padded[i])) for i in lib.key_order(padded)]


# --- the core against the model --------------------------------------------------------

def colliding_stream(rng, n_keys: int, max_conts: int) -> list[int]:
    """2-gram keys whose continuations share buckets (ids equal mod 13 and 29) and whose
    parts grow past a rehash, each continuation seen once or twice (many ties)."""
    toks = []
    for key in range(n_keys):
        conts = rng.choice(np.arange(0, 13 * 29 * 8, 13 if key % 2 else 29), int(rng.integers(2, max_conts)),
                           replace=False)
        for c in conts:
            toks += [5000 + key, 6000, int(c)] * int(rng.integers(1, 3))
    return toks


def test_core_saves_pairs_in_the_models_order():
    rng = np.random.default_rng(11)
    toks = colliding_stream(rng, 40, 60)
    cache = nc.NgramCache()
    cache.update(toks, 2, 2)
    model: dict = {}
    ref.update(model, toks, 2, 2)
    assert cache.to_bytes() == ref.to_bytes(model)


def test_core_static_ties_follow_the_model():
    """A built table's best token (llama.cpp's choice from the lookup.bin of the same
    tokens) equals the model's at every key of a collision-heavy corpus, ties included."""
    rng = np.random.default_rng(12)
    toks = colliding_stream(rng, 80, 45)
    model: dict = {}
    ref.update(model, toks, 2, 2)
    loaded_model = ref.from_bytes(ref.to_bytes(model))
    table = nc.StaticTable.build(toks)
    cache = nc.NgramCache()
    cache.update(toks, 2, 2)
    from_cache = nc.StaticTable.from_cache(cache)  # the cache as it is, without a file
    ties = 0
    for key in range(80):
        k = (5000 + key, 6000)
        counts = list(model[k].values())
        ties += counts.count(max(counts)) > 1
        assert table.best(list(k))[0] == ref._pick(loaded_model[k], lambda t, c: c)[0]
        assert from_cache.best(list(k))[0] == ref._pick(model[k], lambda t, c: c)[0]
    assert ties > 30  # the test exercises the order, not only clear winners


def test_core_drafts_two_way_ties_as_the_model():
    """Two continuations seen equally often pass the static threshold: the draft is
    decided by the order alone, in memory (newest first) and through a file (oldest)."""
    toks = []
    for key in range(30):
        a, b = 13 * key, 13 * key + 13 * 31  # same bucket
        toks += [7000 + key, 8000, a, 7000 + key, 8000, b] * 2
    cache = nc.NgramCache()
    cache.update(toks, 2, 2)
    model: dict = {}
    ref.update(model, toks, 2, 2)
    loaded, loaded_model = nc.NgramCache.from_bytes(cache.to_bytes()), ref.from_bytes(ref.to_bytes(model))
    empty = nc.NgramCache()
    for key in range(30):
        seq = [7000 + key, 8000]
        assert nc.draft(seq, 1, empty, static=cache).tolist() == ref.draft(seq, 1, {}, static=model) == [13 * key + 403]
        assert nc.draft(seq, 1, empty, static=loaded).tolist() == ref.draft(seq, 1, {}, static=loaded_model) == [13 * key]
