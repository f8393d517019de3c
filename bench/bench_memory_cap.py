"""What NgramCache's memory cap costs an update: 1 M text-like tokens (a Zipf law over a
50,000-token vocabulary) counted in one call, without a cap, with a cap never reached, and
with a 32 MiB cap that makes the cache forget; the three take turns in every round.

    python bench/bench_memory_cap.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import ngramcache as nc

VARIANTS = (("no cap", None), ("cap never reached", 1 << 34), ("32 MiB cap", 32 << 20))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    tokens = (np.random.default_rng(0).zipf(1.3, 1_000_000) % 50_000).astype(np.int32)
    times = {name: [] for name, _ in VARIANTS}
    shape = {}
    for _ in range(args.rounds):
        for name, cap in VARIANTS:
            cache = nc.NgramCache(max_bytes=cap)
            t0 = time.perf_counter()
            cache.update(tokens)
            times[name].append(time.perf_counter() - t0)
            shape[name] = (len(cache), cache.evicted, cache.nbytes)
    base = statistics.median(times["no cap"])
    print(f"{'variant':<18} {'median s':>9} {'vs no cap':>9} {'n-grams':>10} {'forgotten':>10} {'MiB held':>9}")
    for name, _ in VARIANTS:
        med = statistics.median(times[name])
        keys, evicted, nbytes = shape[name]
        print(f"{name:<18} {med:>9.3f} {med / base:>9.2f} {keys:>10,} {evicted:>10,} {nbytes / 2**20:>9.1f}")


if __name__ == "__main__":
    main()
