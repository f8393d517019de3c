"""Two or more builds of ngramcache side by side: the per-call costs of the hot paths.

    python bench/bench_builds.py --runs 7 old=/path/to/old-venv/bin/python new=.venv/bin/python

Each NAME=PYTHON is an interpreter with an ngramcache installed (e.g. a virtual environment
holding an earlier commit). Runs alternate between the builds process by process (who goes
first rotates), each run keeps the fastest of its repeats in CPU time (load from other
processes only adds time), and the table gives the median over runs and the ratio of every
build to the first. Figures, all on ../shared/vectors/prose.tokens.i32 (SmolLM2 tokens of
real prose):

- draft: one ``draft`` call on a 4-token array / a 4-token list, context cache of 20k tokens,
  with and without the static table built from the stream;
- update: ``NgramCache.update(nnew=1)`` over a growing sequence;
- lookup step / copy step: a ``LookupDrafter`` / ``CopyDrafter`` step (``propose(8)`` then
  ``accept`` of the next token), after ``reset`` on 2,000 tokens;
- replay: ``replay(prose, 4096, 8, static=table)`` (llama-lookup-stats' loop, C++);
- build: ``StaticTable.build`` on 1 M tokens (the stream shifted per copy, vocabulary 49,152).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

VECTORS = Path(__file__).resolve().parent.parent.parent / "shared" / "vectors"

ONE_RUN = r"""
import json, sys, time, timeit
import numpy as np
import ngramcache as nc

prose = np.fromfile(sys.argv[1], dtype="<i4").astype(np.int32)
out = {}
cpu = time.process_time
ctx = nc.NgramCache(); ctx.update(prose[:20000], 1, 4)
table = nc.StaticTable.build(prose)
tok4 = prose[5000:5004].copy(); lst4 = tok4.tolist()
N = 20000
for name, f in (("draft (us)", lambda: nc.draft(tok4, 8, ctx)),
                ("draft+static (us)", lambda: nc.draft(tok4, 8, ctx, None, table)),
                ("draft, list (us)", lambda: nc.draft(lst4, 8, ctx))):
    out[name] = min(timeit.repeat(f, number=N, repeat=7, timer=cpu)) / N * 1e6
views = [prose[:i] for i in range(8, 8 + N)]
def upd():
    c = nc.NgramCache()
    for v in views:
        c.update(v, 1, 4, nnew=1)
out["update (us)"] = min(timeit.repeat(upd, number=1, repeat=5, timer=cpu)) / N * 1e6
for name, make in (("lookup step (us)", lambda: nc.LookupDrafter(n_draft=8)),
                   ("copy step (us)", lambda: nc.CopyDrafter(n_draft=8))):
    best = float("inf")
    for _ in range(5):
        d = make()
        t0 = cpu()
        d.reset(prose[:2000])
        for i in range(2000, 4000):
            d.propose(8)
            d.accept(prose[i:i + 1])
        best = min(best, cpu() - t0)
    out[name] = best / 2000 * 1e6
out["replay (ms)"] = min(timeit.repeat(lambda: nc.replay(prose, 4096, 8, static=table), number=1, repeat=5,
                                       timer=cpu)) * 1e3
reps = -(-1_000_000 // prose.size)
tok1m = np.concatenate([(prose + 7919 * k) % 49152 for k in range(reps)])[:1_000_000].astype(np.int32)
out["build 1M (ms)"] = min(timeit.repeat(lambda: nc.StaticTable.build(tok1m), number=1, repeat=5, timer=cpu)) * 1e3
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("builds", nargs="+", metavar="NAME=PYTHON")
    ap.add_argument("--runs", type=int, default=7, help="runs per build (medians are reported)")
    ap.add_argument("--tokens", default=str(VECTORS / "prose.tokens.i32"))
    ap.add_argument("--json", help="also write every run here")
    args = ap.parse_args()
    builds = dict(b.split("=", 1) for b in args.builds)
    names = list(builds)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.runs):
        for n in names[r % len(names):] + names[:r % len(names)]:
            done = subprocess.run([builds[n], "-c", ONE_RUN, args.tokens], capture_output=True, text=True,
                                  check=True, cwd="/")
            runs[n].append(json.loads(done.stdout))
            print(n, done.stdout.strip(), file=sys.stderr, flush=True)
    keys = list(runs[names[0]][0])
    med = {n: {k: statistics.median(x[k] for x in runs[n]) for k in keys} for n in names}
    head = f"| figure | {' | '.join(names)} | " + " | ".join(f"{n}/{names[0]}" for n in names[1:]) + " |"
    print(head)
    print("|" + "---|" * (1 + 2 * len(names) - 1))
    for k in keys:
        cells = [f"{med[n][k]:.3f}" for n in names] + [f"{med[n][k] / med[names[0]][k]:.3f}" for n in names[1:]]
        print(f"| {k} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "medians": med}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
