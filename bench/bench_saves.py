"""What a save costs: the median wall time of one save through ``files.atomic_open`` (the
helper every writer of the package uses), for a small file alone in its folder, the same
file in a folder of 10,000 others (a save lists its folder for temporary files that dead
writers left), and a 64 MiB token file.

    python bench/bench_saves.py [--repeats 200] [--folder DIR]

Every save fsyncs the file and the folder, so the figures are mostly the disk's; run it on
the file system the caches live on (--folder, default: a new folder in the system's
temporary folder). Prints one JSON object (milliseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ngramcache.files import atomic_open, write_tokens_file

SMALL = os.urandom(4096)


def _median_ms(save, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        save()
        times.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(times), 3)


def _save_small(path: Path) -> None:
    with atomic_open(path) as f:
        f.write(SMALL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--folder", help="where to save (default: a new temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.folder) as d:
        root = Path(d)
        alone = root / "alone"
        alone.mkdir()
        crowded = root / "crowded"
        crowded.mkdir()
        for i in range(10_000):
            (crowded / f"other-{i:05d}.bin").write_bytes(b"")
        tokens = np.arange(16 << 20, dtype=np.int32)  # 64 MiB as int32
        result = {
            "small_alone_ms": _median_ms(lambda: _save_small(alone / "small.bin"), args.repeats),
            "small_among_10000_ms": _median_ms(lambda: _save_small(crowded / "small.bin"), args.repeats),
            "tokens_64mib_ms": _median_ms(lambda: write_tokens_file(alone / "big.i32", tokens),
                                          max(3, args.repeats // 40)),
            "repeats": args.repeats,
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
