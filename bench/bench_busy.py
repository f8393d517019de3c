"""On a busy machine: ``ngramcache generate`` beside six processes that burst on and off, as
other programs on a laptop or a shared server do, against plain decoding in the same window.

    .venv/bin/python bench/bench_busy.py                     # six bursty processes, 5 pairs of runs
    .venv/bin/python bench/bench_busy.py --busy 0 --pairs 3  # the same on the quiet machine
    .venv/bin/python bench/bench_busy.py --json out.json

Each run is a whole command, a fresh process as a user starts it: ``python -m ngramcache
generate -m smollm2 -f <the edit prompt> -n 128 --json``, the default drafter (``copy`` behind
the gate) against ``--no-draft``, alternated (plain first in even pairs, ngramcache first in odd
ones) so that the load hits both alike. The prompt is the copy-heavy edit of the end-to-end
benchmark (``ngramcache.data``'s "edit code": add type hints to a standard-library function).
The cost store starts empty (``NGRAMCACHE_CACHE_DIR`` a fresh folder): the first ngramcache
run starts from the package's prior curve for the model's size, later ones from what the
earlier runs learnt and saved.

The load: ``--busy`` processes (default 6), each spinning the CPU for a random 20-400 ms, then
sleeping a random 20-400 ms, over and over (seeded), started before the first run and stopped
after the last. Reported per run: wall time of the command, generation speed (tokens after the
prompt / their time), tokens drafted and accepted, and the sentence the run gives when it
drafted nothing; per pair, ngramcache's generation speed over plain's and its wall time minus
plain's; /proc/loadavg before and after.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from ngramcache import data  # noqa: E402


def burst(seed: int, stop) -> None:
    """Spin for 20-400 ms, sleep 20-400 ms, until ``stop`` is set."""
    rng = random.Random(seed)
    x = 0
    while not stop.is_set():
        end = time.perf_counter() + rng.uniform(0.020, 0.400)
        while time.perf_counter() < end:
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        time.sleep(rng.uniform(0.020, 0.400))


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def run_once(prompt_file: str, plain: bool, cache_dir: str, n_predict: int, model: str) -> dict:
    cmd = [sys.executable, "-m", "ngramcache", "generate", "-m", model, "-f", prompt_file, "-n", str(n_predict),
           "--json"] + (["--no-draft"] if plain else [])
    env = dict(os.environ, NGRAMCACHE_CACHE_DIR=cache_dir)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    f = json.loads(out.stdout)
    return {"plain": plain, "wall_s": wall, "gen_tok_s": f["n_decoded"] / f["t_decode"] if f["t_decode"] else 0.0,
            "n_decoded": f["n_decoded"], "drafted": f["n_drafted"], "accepted": f["n_accept"],
            "why_no_drafts": f.get("why_no_drafts"), "tokens": f["text"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", type=int, default=6, help="bursty processes beside the runs (default 6)")
    ap.add_argument("--pairs", type=int, default=5, help="pairs of runs, plain and ngramcache (default 5)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per run (default 128)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FNAME", help="also write the figures here")
    args = ap.parse_args(argv)
    task = next(t for t in data.bench_tasks() if t.name == "edit code")
    with tempfile.TemporaryDirectory() as tmp:
        prompt_file = os.path.join(tmp, "prompt.txt")
        Path(prompt_file).write_text(task.prompt, encoding="utf-8")
        cache_dir = os.path.join(tmp, "cost-store")  # fresh: nothing learnt yet
        load_before = loadavg()
        stop = mp.Event()
        procs = [mp.Process(target=burst, args=(args.seed * 100 + i, stop), daemon=True) for i in range(args.busy)]
        for p in procs:
            p.start()
        runs = []
        try:
            for i in range(args.pairs):
                order = (True, False) if i % 2 == 0 else (False, True)
                pair = {}
                for plain in order:
                    r = run_once(prompt_file, plain, cache_dir, args.tokens, args.model)
                    pair["plain" if plain else "ngramcache"] = r
                    print(f"pair {i + 1} {'plain     ' if plain else 'ngramcache'} wall {r['wall_s']:6.2f} s, "
                          f"{r['gen_tok_s']:6.1f} tok/s, drafted {r['drafted']}, accepted {r['accepted']}"
                          + (f" ({r['why_no_drafts']})" if r["why_no_drafts"] else ""), flush=True)
                runs.append(pair)
                if args.json:  # after every pair: a run cut short keeps what it measured
                    Path(args.json).write_text(json.dumps({"busy": args.busy, "tokens": args.tokens,
                                                           "loadavg_before": load_before, "pairs": runs}, indent=1))
        finally:
            stop.set()
            for p in procs:
                p.join(timeout=5)
        load_after = loadavg()
    same = all(p["plain"]["tokens"] == p["ngramcache"]["tokens"] for p in runs)
    rows = []
    for i, p in enumerate(runs):
        g, n = p["plain"], p["ngramcache"]
        rows.append({"pair": i + 1, "first": i == 0, "speedup": n["gen_tok_s"] / g["gen_tok_s"],
                     "overhead_s": n["wall_s"] - g["wall_s"], "drafted": n["drafted"], "accepted": n["accepted"],
                     "plain_wall_s": g["wall_s"], "ngc_wall_s": n["wall_s"], "why_no_drafts": n["why_no_drafts"]})
    print(f"\n{args.busy} bursty processes, {args.pairs} pairs, {args.tokens} tokens, model {args.model}; "
          f"loadavg before {load_before}, after {load_after}; outputs identical to plain: {same}\n")
    print("| pair | ngramcache / plain (generation) | wall: plain, ngramcache, difference | drafted / accepted |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['pair']}{' (first)' if r['first'] else ''} | {r['speedup']:.2f}x | {r['plain_wall_s']:.1f} s, "
              f"{r['ngc_wall_s']:.1f} s, {r['overhead_s']:+.1f} s | {r['drafted']} / {r['accepted']} |")
    sp = [r["speedup"] for r in rows]
    later = [r["overhead_s"] for r in rows[1:]]
    print(f"\nspeed-up: median {statistics.median(sp):.2f}x, min {min(sp):.2f}x; every run drafted: "
          f"{all(r['drafted'] > 0 for r in rows)}; first run {rows[0]['overhead_s']:+.1f} s against plain"
          + (f"; later runs {min(later):+.1f} to {max(later):+.1f} s" if later else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"busy": args.busy, "tokens": args.tokens, "model": args.model,
                                               "loadavg_before": load_before, "loadavg_after": load_after,
                                               "identical": same, "pairs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
