"""``create`` in one process against ``create --workers N`` (a Dask LocalCluster), on the
Python standard library's ``*.py`` files, side by side in one run; with ``--merge K``,
``merge`` of K tables instead: the streaming merge of sorted runs against adding the
inputs up in one ``NgramCache`` (how ``merge`` worked before).

Every configuration runs as its own ``ngramcache create ... --json`` process, the
configurations taking turns in each round so that a busy machine slows them alike. For
each: wall-clock seconds of the whole command (cluster start included), the command's
stage times, and the peak RSS of the command's own process (for ``--workers`` that is the
merging side; the worker processes are not counted). Every output is checked to be
byte-identical to the single-process one.

    python bench/bench_sharded.py                      # all of the stdlib, 3 rounds
    python bench/bench_sharded.py --root /usr/lib/python3.11 --rounds 1 --limit-mb 4
    python bench/bench_sharded.py --merge 8 --rounds 3     # 8 tables of the stdlib stream
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path


def stdlib_files(root: Path, limit_bytes: int | None) -> list[Path]:
    files = sorted((p for p in root.rglob("*.py")
                    if "site-packages" not in p.parts and "__pycache__" not in p.parts and p.is_file()),
                   key=lambda p: p.relative_to(root).parts)
    if limit_bytes is None:
        return files
    out, total = [], 0
    for f in files:
        if total >= limit_bytes:
            break
        out.append(f)
        total += f.stat().st_size
    return out


def run_create(files: list[Path], out: Path, model: str, extra: list[str]) -> dict:
    argv = [sys.executable, "-m", "ngramcache", "create", "-m", model, "-lcs", str(out), "--json", "-q", *extra]
    for f in files:
        argv += ["-f", str(f)]
    t = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(extra)}: exit {r.returncode}\n{r.stderr}")
    s = json.loads(r.stdout)
    s["wall_seconds"] = wall
    s["sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
    out.unlink()
    return s


IN_MEMORY_MERGE = """
import json, os, resource, sys, time
from ngramcache.files import load_counts
from ngramcache.cli._caches import write_cache
t = time.perf_counter()
*inputs, out = sys.argv[1:]
merged = load_counts(inputs[0])
for p in inputs[1:]:
    merged.merge(load_counts(p))
write_cache(merged, out, "ngst")
print(json.dumps({"seconds": time.perf_counter() - t,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


BUILD_INPUTS = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from stdlib_stream import stdlib_tokens
from ngramcache import StaticTable
tokens = stdlib_tokens(7_900_000)  # nearly all of it (7.93 M with CPython 3.11.7)
for path, part in zip(sys.argv[2:], np.array_split(tokens, len(sys.argv) - 2)):
    StaticTable.build(np.ascontiguousarray(part), 2).save(path)
print(tokens.size)
"""


def bench_merge(k: int, rounds: int) -> int:
    """K tables of consecutive slices of the stdlib token stream, merged both ways."""
    rows: dict[str, list[dict]] = {"streaming (merge)": [], "in one NgramCache (before)": []}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = [Path(tmp) / f"in{i}.ngst" for i in range(k)]
        # In another process: a child's peak RSS starts at its parent's size when forked,
        # so this process stays small.
        n_tokens = int(subprocess.run([sys.executable, "-c", BUILD_INPUTS, str(Path(__file__).resolve().parent),
                                       *map(str, inputs)], capture_output=True, text=True, check=True).stdout)
        in_bytes = sum(p.stat().st_size for p in inputs)
        shas = set()
        for r in range(rounds):
            out = Path(tmp) / "out.ngst"
            t = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "ngramcache", "merge", *map(str, inputs), str(out),
                                  "--json", "-q"], capture_output=True, text=True, check=True)
            s = json.loads(res.stdout)
            s["wall_seconds"] = time.perf_counter() - t
            rows["streaming (merge)"].append(s)
            shas.add(hashlib.sha256(out.read_bytes()).hexdigest())
            t = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", IN_MEMORY_MERGE, *map(str, inputs), str(out)],
                                 capture_output=True, text=True, check=True)
            s = json.loads(res.stdout)
            s["wall_seconds"] = time.perf_counter() - t
            rows["in one NgramCache (before)"].append(s)
            shas.add(hashlib.sha256(out.read_bytes()).hexdigest())
            print(f"round {r + 1} done", file=sys.stderr)
        out_bytes = out.stat().st_size
    print(f"{k} tables of the stdlib stream ({n_tokens:,} tokens in all), {in_bytes / 2**20:.0f} MiB of "
          f"inputs, output {out_bytes / 2**20:.0f} MiB; outputs byte-identical: {len(shas) == 1}")
    print("| merge | wall s (median) | runs | peak RSS (median MiB) |")
    print("|---|---|---|---|")
    for name, runs in rows.items():
        each = ", ".join(f"{s['wall_seconds']:.1f}" for s in runs)
        rss = statistics.median(s["peak_rss_bytes"] for s in runs) / 2**20
        print(f"| {name} | {statistics.median(s['wall_seconds'] for s in runs):.1f} | {each} | {rss:.0f} |")
    return 0 if len(shas) == 1 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    ap.add_argument("--limit-mb", type=float, default=None, help="only the first files, up to this many MB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--format", choices=["ngst", "bin"], default="ngst")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--merge", type=int, default=None, metavar="K", help="benchmark merge of K tables instead")
    args = ap.parse_args()
    if args.merge:
        return bench_merge(args.merge, args.rounds)

    files = stdlib_files(args.root, None if args.limit_mb is None else int(args.limit_mb * 1e6))
    total = sum(f.stat().st_size for f in files)
    configs = {"1 process (-j 1)": ["-j", "1"], "--workers 1": ["--workers", "1"], "--workers 2": ["--workers", "2"]}
    rows: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"out.{args.format}"
        for r in range(args.rounds):
            for name, extra in configs.items():
                rows[name].append(run_create(files, out, args.model, extra))
                s = rows[name][-1]
                print(f"round {r + 1} {name}: {s['wall_seconds']:.1f} s, peak {s['peak_rss_bytes'] / 2**20:.0f} MiB",
                      file=sys.stderr)
    want = rows["1 process (-j 1)"][0]["sha256"]
    same = all(s["sha256"] == want for runs in rows.values() for s in runs)
    print(f"corpus: {len(files)} files, {total / 1e6:.1f} MB, {rows['--workers 2'][0]['tokens']:,} tokens "
          f"({args.root}); {os.cpu_count()} CPUs; outputs byte-identical: {same}")
    print("| create | wall s (median) | runs | stages (median s) | peak RSS, this process (median MiB) |")
    print("|---|---|---|---|---|")
    summary = {}
    for name, runs in rows.items():
        wall = statistics.median(s["wall_seconds"] for s in runs)
        rss = statistics.median(s["peak_rss_bytes"] for s in runs) / 2**20
        stages = {k: statistics.median(s["stage_seconds"].get(k, 0.0) for s in runs) for k in runs[0]["stage_seconds"]}
        stage_txt = ", ".join(f"{k} {v:.1f}" for k, v in stages.items())
        each = ", ".join(f"{s['wall_seconds']:.1f}" for s in runs)
        print(f"| {name} | {wall:.1f} | {each} | {stage_txt} | {rss:.0f} |")
        summary[name] = {"wall_seconds": [s["wall_seconds"] for s in runs],
                         "peak_rss_bytes": [s["peak_rss_bytes"] for s in runs], "stage_seconds": stages}
    if args.json_out:
        args.json_out.write_text(json.dumps({"files": len(files), "bytes": total, "identical": same,
                                             "configs": summary}, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
