"""Every drafter replayed over the same token streams in C++ (what ``stats --drafter`` prints).

    .venv/bin/python bench/bench_replay_drafters.py [--vectors ../shared/vectors] [-c 4096]
                                                    [--n-draft 16] [--repeat 3]

Streams: the public llama.cpp reference streams (SmolLM2 tokens): ``prose`` (57,344 replayed
tokens of English prose), ``dynpub`` (the same kind of text, another document) and
``small-static`` (248k tokens of repetitive text). Each chunk of ``-c`` tokens is a request;
the drafter proposes up to ``--n-draft`` tokens per step and is handed the accepted tokens
plus the next text token (``ngramcache.replays.replay_drafter``; ``lookup`` is llama.cpp's
lookup through ``ngramcache.replay``, context and dynamic cache as llama-lookup-stats).
Figures: accepted tokens per step (what a verify step gains beyond its own token),
acceptance of drafted tokens, and the drafter's time per step (median of ``--repeat`` runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

import ngramcache as nc
from ngramcache.drafters.catalog import DRAFTERS, make_drafter
from ngramcache.replays import replay_drafter

STREAMS = ("prose", "dynpub", "small-static")
# (label, drafter, options made fresh for every run): each drafter with its defaults, the
# ones with memory across requests also with it, llama.cpp's with bench_e2e.py's sizes too
VARIANTS = [(name, name, dict) for name in DRAFTERS] + [
    ("suffix + store", "suffix", lambda: {"store": nc.SuffixStore()}),
    ("simple 3/16", "simple", lambda: {"size_n": 3, "size_m": 16}),
    ("map-k 3/16", "map-k", lambda: {"size_n": 3, "size_m": 16}),
    ("mod 8/1/16", "mod", lambda: {"n_match": 8, "n_min": 1, "n_max": 16}),
]


def run(name: str, options: dict, toks: np.ndarray, n_ctx: int, n_draft: int):
    if name == "lookup":  # llama-lookup-stats: the dynamic cache learns from every chunk
        return nc.replay(toks, n_ctx, n_draft, dynamic=nc.NgramCache(), update_dynamic=True)
    return replay_drafter(toks, make_drafter(name, n_draft=n_draft, **options), n_ctx, n_draft)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vectors", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "vectors")
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--n-draft", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"-c {args.ctx_size}, up to {args.n_draft} drafted tokens per step; accepted per step "
          f"(acceptance of drafted) / µs per step\n")
    print("| drafter | " + " | ".join(STREAMS) + " |")
    print("|---|" + "---|" * len(STREAMS))
    streams = {s: np.fromfile(args.vectors / f"{s}.tokens.i32", dtype=np.int32) for s in STREAMS}
    for label, name, options in VARIANTS:
        cells = []
        for s, toks in streams.items():
            runs = [run(name, options(), toks, args.ctx_size, args.n_draft) for _ in range(args.repeat)]
            r = runs[0]
            us = statistics.median(x.t_draft / max(1, x.n_steps) for x in runs) * 1e6
            cells.append(f"{r.n_accept / max(1, r.n_steps):.3f} ({100 * r.n_accept / max(1, r.n_drafted):.1f} %) "
                         f"/ {us:.2f} µs")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
