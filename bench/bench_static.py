"""Static table benchmark: StaticTable against NgramCache + llama.cpp's lookup.bin.

Run from the repository root, after ``scripts/dev-build`` (a few minutes; the first run
also tokenizes the corpus, about half a minute, cached in the temp folder afterwards):

    .venv/bin/python bench/bench_static.py            # sizes 8, 16, 31 MB
    .venv/bin/python bench/bench_static.py --sizes 8  # one size
    .venv/bin/python bench/bench_static.py --reps 9   # more create runs per variant

Corpus: CPython's standard library source (``sysconfig.get_paths()["stdlib"]``, every
``*.py`` outside ``site-packages`` and ``__pycache__``, sorted by relative path, bytes
concatenated: 31.5 MB for 3.11.7). Tokenized as in bench/bench_core.py:
``re.findall(r"\\w+|[^\\w\\s]|\\n", text)`` over the UTF-8 text (errors replaced), ids in
first-seen order over the whole stream. Static corpora are the tokens of the files that
start in the first 8, 16 and 31 MB (10^6 bytes); the drafting stream is the tokens of the
files after the 31 MB cut (held out from every corpus). Tokenization time is excluded
everywhere: children read the tokens from raw int32 files.

Each figure comes from a fresh child process (so peak RSS belongs to one variant), and
the variants alternate:
- create: ``StaticTable.build(tokens) + save`` against ``NgramCache().update(tokens, 2, 2)
  + save`` (llama.cpp format, what llama-lookup-create writes); seconds and peak RSS (the
  whole process: interpreter, numpy and the tokens included, as in llama.cpp's figure);
  medians of ``--reps`` alternated runs (default 5);
- file sizes;
- open/load: ``StaticTable.open(ngst)`` against ``NgramCache.load(lookup.bin)``; seconds
  and the resident memory it adds (VmRSS after - before);
- drafting: ``ngramcache.replay`` (llama-lookup-stats' loop in C++, n_ctx 4096, n_draft 8)
  over the held-out stream with the static source as a StaticTable or as an NgramCache;
  microseconds per drafted token, and both must draft and accept exactly the same;
- lookups (needs g++): cpp/bench/bench_static.cpp, ns per find2 + best + count, both
  sources, same answers checked.
llama.cpp's own figures (docs/benchmarks.md, "llama.cpp's figures on this machine kind") are printed beside them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOKEN_RE = r"\w+|[^\w\s]|\n"
MB = 1_000_000
SIZES_MB = (8, 16, 31)
N_CTX, N_DRAFT = 4096, 8
EVAL_TOKENS = 200_000

# llama.cpp 0c1e5709 on this machine kind (docs/benchmarks.md, "llama.cpp's figures on this machine kind")
LLAMA_CREATE = {8: (8.7, 0.60e9), 16: (14.5, 0.85e9), 32: (35.0, 1.31e9)}  # s, peak RSS bytes
LLAMA_COUNT_OBS_PER_S = 3.8e6
LLAMA_LOAD = "36 MB static cache: 1.1-1.2 s, +258 MiB resident (7.5x the file)"
LLAMA_DRAFT_US = "33 us per drafted token with a 36 MB static cache (9.4 without)"


# --- corpus ----------------------------------------------------------------------------

def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py")
             if "site-packages" not in p.parts and "__pycache__" not in p.parts and p.is_file()]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def corpus(work: Path) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """(token stream, [(bytes before file i, tokens before file i)]), cached in `work`."""
    files = stdlib_files()
    tag = hashlib.sha256(f"{TOKEN_RE}|{sys.version_info[:2]}|{len(files)}".encode()).hexdigest()[:12]
    tok_path, idx_path = work / f"stdlib-{tag}.i32", work / f"stdlib-{tag}.idx.json"
    if tok_path.is_file() and idx_path.is_file():
        return np.fromfile(tok_path, dtype="<i4").astype(np.int32), json.loads(idx_path.read_text())
    print(f"tokenizing {len(files)} stdlib files (once; cached in {work})", file=sys.stderr)
    pattern = re.compile(TOKEN_RE)
    ids: dict[str, int] = {}
    out: list[int] = []
    index, nbytes = [], 0
    for p in files:
        data = p.read_bytes()
        index.append((nbytes, len(out)))
        nbytes += len(data)
        out.extend(ids.setdefault(w, len(ids)) for w in pattern.findall(data.decode("utf-8", errors="replace")))
    index.append((nbytes, len(out)))
    arr = np.asarray(out, dtype="<i4")
    arr.tofile(tok_path)
    idx_path.write_text(json.dumps(index))
    return arr.astype(np.int32), index


def tokens_before(index, n_bytes: int) -> int:
    """Tokens of the files that start before byte n_bytes."""
    return next((t for b, t in index if b >= n_bytes), index[-1][1])


# --- children: one variant per process -------------------------------------------------

def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss() -> int:
    return _status("VmRSS")


def peak_rss() -> int:
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over execve, so a child
    # would report its parent's peak (the tokenizer's) whenever that is larger.
    return _status("VmHWM")


def child(name: str, args: list[str]) -> dict:
    import ngramcache as nc

    if name in ("create-static", "create-cache"):
        toks = np.fromfile(args[0], dtype="<i4").astype(np.int32)
        base = rss()
        t0 = time.perf_counter()
        if name == "create-static":
            obj = nc.StaticTable.build(toks)
        else:
            obj = nc.NgramCache()
            obj.update(toks, 2, 2)
        t1 = time.perf_counter()
        obj.save(args[1])
        t2 = time.perf_counter()
        return {"count_s": t1 - t0, "save_s": t2 - t1, "peak_rss": peak_rss(), "base_rss": base,
                "keys": len(obj)}
    if name == "open-static":
        base = rss()
        t0 = time.perf_counter()
        t = nc.StaticTable.open(args[0])
        t1 = time.perf_counter()
        added = rss() - base
        times = []
        for _ in range(20):  # steady state: the file is in the page cache either way
            s = time.perf_counter()
            nc.StaticTable.open(args[0])
            times.append(time.perf_counter() - s)
        s = time.perf_counter()
        t.verify()
        return {"open_s": t1 - t0, "open_min_s": min(times), "rss_added": added,
                "verify_s": time.perf_counter() - s}
    if name == "load-cache":
        base = rss()
        t0 = time.perf_counter()
        nc.NgramCache.load(args[0])
        t1 = time.perf_counter()
        return {"open_s": t1 - t0, "rss_added": rss() - base}
    if name == "draft":
        stream = np.fromfile(args[0], dtype="<i4").astype(np.int32)
        sources = {"static": nc.StaticTable.open(args[1]), "cache": nc.NgramCache.load(args[2])}
        best: dict[str, float] = {}
        seen: dict[str, tuple] = {}
        for _ in range(3):
            for k, st in sources.items():
                r = nc.replay(stream, N_CTX, N_DRAFT, static=st)
                best[k] = min(best.get(k, 1e9), r.t_draft / max(1, r.n_drafted) * 1e6)
                seen[k] = (r.n_drafted, r.n_accept)
        if seen["static"] != seen["cache"]:
            raise SystemExit(f"drafts differ: {seen}")
        return {"us_static": best["static"], "us_cache": best["cache"], "n_drafted": seen["static"][0],
                "n_accept": seen["static"][1], "stream_tokens": int(stream.size)}
    raise SystemExit(f"unknown child {name}")


def run_child(name: str, *args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", name, *map(str, args)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def lookup_bench(work: Path, ngst: Path, lcs: Path, stream: Path) -> dict | None:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None
    exe = work / "bench_static_lookup"
    src = ROOT / "cpp" / "bench" / "bench_static.cpp"
    subprocess.run([cxx, "-O2", "-std=c++17", f"-I{ROOT / 'cpp' / 'include'}", str(src), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe), str(ngst), str(lcs), str(stream)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


# --- driver ----------------------------------------------------------------------------

def medians(runs: list[dict]) -> dict:
    """Per-field medians of child results; `total_s` (count + save) is the median of the sums."""
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    out["total_s"] = statistics.median(r["count_s"] + r["save_s"] for r in runs)
    out["reps"] = len(runs)
    return out


def fmt_mb(b: float) -> str:
    return f"{b / 2**20:,.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES_MB)), help="corpus sizes in MB (10^6 bytes)")
    ap.add_argument("--reps", type=int, default=5, help="alternated create runs per variant (medians)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "ngramcache-bench-static"))
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], a.child[1:])))
        return 0

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    toks, index = corpus(work)
    sizes = [int(s) for s in a.sizes.split(",")]
    # The drafting stream: files after the largest corpus (the last 0.5 MB of the stdlib).
    eval_from = tokens_before(index, max(max(sizes), SIZES_MB[-1]) * MB)
    stream_path = work / "eval.i32"
    toks[eval_from:eval_from + EVAL_TOKENS].astype("<i4").tofile(stream_path)
    print(f"stream: {toks.size:,} tokens, {int(toks.max()) + 1:,} ids; drafting stream: "
          f"{min(EVAL_TOKENS, toks.size - eval_from):,} held-out tokens", file=sys.stderr)

    rows = []
    for size in sizes:
        n = tokens_before(index, size * MB)
        tok_path = work / f"corpus-{size}.i32"
        toks[:n].astype("<i4").tofile(tok_path)
        ngst, lcs = work / f"corpus-{size}.ngst", work / f"corpus-{size}.bin"
        print(f"{size} MB: {n:,} tokens ...", file=sys.stderr)
        # Alternated repetitions, medians: the machine is shared and noisy.
        runs_s, runs_c = [], []
        for _ in range(a.reps):
            runs_s.append(run_child("create-static", tok_path, ngst))
            runs_c.append(run_child("create-cache", tok_path, lcs))
        cs, cc = medians(runs_s), medians(runs_c)
        os_ = run_child("open-static", ngst)
        oc = run_child("load-cache", lcs)
        dr = run_child("draft", stream_path, ngst, lcs)
        rows.append({"size_mb": size, "tokens": n, "create_static": cs, "create_cache": cc,
                     "create_static_runs": runs_s, "create_cache_runs": runs_c,
                     "ngst_bytes": ngst.stat().st_size, "llama_bytes": lcs.stat().st_size,
                     "open_static": os_, "load_cache": oc, "draft": dr})
    lk = lookup_bench(work, work / f"corpus-{sizes[-1]}.ngst", work / f"corpus-{sizes[-1]}.bin", stream_path)

    print(f"\ncreate: medians of {a.reps} alternated runs; obs/s = observations / (count + save); "
          f"llama.cpp counts at {LLAMA_COUNT_OBS_PER_S / 1e6} M obs/s (anchors)")
    print("\n| corpus | tokens | StaticTable build + save | NgramCache update + save (llama format) | "
          "StaticTable vs NgramCache / vs llama.cpp counting | llama-lookup-create (anchors) | "
          "peak RSS: StaticTable / NgramCache / llama.cpp |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cs, cc = r["create_static"], r["create_cache"]
        ll = LLAMA_CREATE.get(r["size_mb"]) or LLAMA_CREATE[32]
        obs = r["tokens"] - 2
        print(f"| {r['size_mb']} MB | {r['tokens']:,} | {cs['count_s']:.3f} + {cs['save_s']:.3f} s: "
              f"{obs / cs['total_s'] / 1e6:.1f} M obs/s | {cc['count_s']:.3f} + {cc['save_s']:.3f} s: "
              f"{obs / cc['total_s'] / 1e6:.1f} M obs/s | {cc['total_s'] / cs['total_s']:.1f}x / "
              f"**{obs / cs['total_s'] / LLAMA_COUNT_OBS_PER_S:.1f}x** | {ll[0]} s (counting: "
              f"{obs / LLAMA_COUNT_OBS_PER_S:.2f} s) | {fmt_mb(cs['peak_rss'])} / {fmt_mb(cc['peak_rss'])} / "
              f"{fmt_mb(ll[1])} (tokens + interpreter: {fmt_mb(cs['base_rss'])}) |")
    print("\n| corpus | file: NGST / lookup.bin | open: StaticTable.open / NgramCache.load | resident added | "
          "verify | draft us/token: StaticTable / NgramCache (drafted, accepted) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        o, l, d = r["open_static"], r["load_cache"], r["draft"]
        print(f"| {r['size_mb']} MB | {fmt_mb(r['ngst_bytes'])} / {fmt_mb(r['llama_bytes'])} | "
              f"{o['open_s'] * 1e6:.0f} us (warm {o['open_min_s'] * 1e6:.0f} us) / {l['open_s']:.2f} s "
              f"(**{l['open_s'] / o['open_s']:,.0f}x**) | {fmt_mb(o['rss_added'])} / {fmt_mb(l['rss_added'])} | "
              f"{o['verify_s']:.2f} s | {d['us_static']:.2f} / {d['us_cache']:.2f} ({d['n_drafted']:,}, "
              f"{d['n_accept']:,}) |")
    print(f"\nllama.cpp (anchors): loading a {LLAMA_LOAD}; {LLAMA_DRAFT_US}.")
    if lk:
        print(f"lookups ({sizes[-1]} MB table, {lk['lookups']:,} 2-grams of the held-out stream, "
              f"{lk['present']:,} present): StaticTable {lk['ns_static_table']:.0f} ns, "
              f"NgramCache {lk['ns_ngramcache']:.0f} ns per find2 + best + count")
    (work / "results.json").write_text(json.dumps({"rows": rows, "lookups": lk}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
