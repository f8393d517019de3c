"""Proposer latency against context length, side by side with the prompt lookups people use.

    .venv/bin/python bench/bench_propose.py [--contexts 1024,8192,32768,131072] [--steps 400]
                                            [--budget 2.0] [--json out.json]

Text: CPython's own tests (lib/python3.X/test/**/*.py, sorted path order, as bench_stats.py's
anchor text), tokenized with SmolLM2's tokenizer, so real code with real repeats. For each
context length L, every proposer starts with the first L tokens and then runs a decoding
loop over the text that follows: propose up to 10 tokens, then append the next text token
(the token a model would have produced), ``--steps`` times or until ``--budget`` seconds
are spent. The figure is the median time of one step (propose + append), in microseconds;
for ngramcache's drafters also the propose call alone (a peer's call is its whole step: it
keeps no state, so appending costs it nothing and every call rescans).

Proposers:
  * ngramcache: every drafter of ``ngramcache.drafters.catalog`` through its Python API (``propose``
    then ``accept``: "step"; ``propose`` alone: "propose only"), and the compiled core's
    own calls of the same drafter ("core step": the ``_core`` object's propose and accept,
    argument conversion included);
  * llama-cpp-python's ``LlamaPromptLookupDecoding`` (max_ngram_size 2, 10 tokens), which
    rescans the whole context with numpy at every step;
  * transformers' ``PromptLookupCandidateGenerator`` (max_matching_ngram_size 2, 10 tokens,
    CPU torch), which rescans with torch ``unfold`` at every step;
  * llama.cpp's ngram-simple scan (size_n 12, size_m 48) transcribed in Python from the spec
    (tests/reference_speculative.py), the backward scan llama.cpp runs in C++.

ngramcache's ``pld`` with max_ngram 2 proposes exactly what llama-cpp-python's proposer
does (match="first"): the benchmark checks it on every step it times both, and fails
otherwise. A peer that is not installed is left out and said so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import ngramcache as nc
from ngramcache.drafters.catalog import DRAFTERS, make_drafter

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from bench_stats import concat, make_tokenizer, sorted_py, stdlib, tokens_of  # noqa: E402

N_PROPOSE = 10
# per drafter: options that make it comparable with the peers (prompt lookup's 2-gram keys)
OPTIONS = {"pld": {"max_ngram": 2, "min_ngram": 1, "match": "first"}}


def text_tokens(n_min: int, cache_dir: Path) -> np.ndarray:
    files = sorted_py(stdlib() / "test")
    toks = tokens_of(concat(files, limit=max(2_000_000, n_min * 5)), make_tokenizer(), cache_dir, "propose")
    if toks.size < n_min:
        raise SystemExit(f"the text has {toks.size:,} tokens, fewer than the {n_min:,} needed")
    return toks


def time_steps(step, n_steps: int, budget_s: float) -> list[float]:
    """Per-step times (seconds) of step(j), j = 0.., until n_steps or the budget is spent."""
    times = []
    t_end = time.perf_counter() + budget_s
    for j in range(n_steps):
        t0 = time.perf_counter()
        step(j)
        times.append(time.perf_counter() - t0)
        if time.perf_counter() > t_end and len(times) >= 5:
            break
    return times


def ngc_python(name: str, toks: np.ndarray, L: int, n_steps: int, budget: float):
    d = make_drafter(name, n_draft=N_PROPOSE, **OPTIONS.get(name, {}))
    d.reset(toks[:L])
    proposals, propose_times = [], []
    clock = time.perf_counter

    def step(j):
        t0 = clock()
        proposals.append(d.propose(N_PROPOSE))
        propose_times.append(clock() - t0)
        d.accept(toks[L + j : L + j + 1])

    return time_steps(step, n_steps, budget), proposals, propose_times


def ngc_core(name: str, toks: np.ndarray, L: int, n_steps: int, budget: float):
    d = make_drafter(name, n_draft=N_PROPOSE, **OPTIONS.get(name, {}))
    core = getattr(d, "_core", None)
    if core is None:
        return None
    core.reset(toks[:L])
    nxt = [toks[L + j : L + j + 1].copy() for j in range(n_steps)]

    def step(j):
        core.propose(N_PROPOSE)
        core.accept(nxt[j])

    return time_steps(step, n_steps, budget)


def llama_cpp_pld(toks: np.ndarray, L: int, n_steps: int, budget: float):
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    pld = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=N_PROPOSE)
    ids = toks.astype(np.intc)
    proposals = []

    def step(j):
        proposals.append(pld(ids[: L + j]))

    return time_steps(step, n_steps, budget), proposals


def transformers_pld(toks: np.ndarray, L: int, n_steps: int, budget: float):
    import torch
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    torch.set_num_threads(1)
    gen = PromptLookupCandidateGenerator(num_output_tokens=N_PROPOSE, max_matching_ngram_size=2,
                                         max_length=L + n_steps + 2 * N_PROPOSE)
    ids = torch.from_numpy(toks.astype(np.int64)).unsqueeze(0)

    def step(j):
        gen.get_candidates(ids[:, : L + j])

    return time_steps(step, n_steps, budget)


def ngram_simple_scan(toks: np.ndarray, L: int, n_steps: int, budget: float):
    from reference_speculative import simple_draft

    seq = toks.tolist()

    def step(j):
        simple_draft(seq[: L + j - 1], seq[L + j - 1], 12, 48)

    return time_steps(step, n_steps, budget)


def median_us(times) -> float:
    return statistics.median(times) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="1024,8192,32768,131072")
    ap.add_argument("--steps", type=int, default=400, help="steps per proposer and context (default 400)")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds per proposer and context (default 2)")
    ap.add_argument("--drafters", default=",".join(DRAFTERS), help="ngramcache drafters (default: all)")
    ap.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "ngramcache-bench")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    contexts = [int(x) for x in args.contexts.split(",")]
    names = [x for x in args.drafters.split(",") if x]
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    toks = text_tokens(max(contexts) + args.steps + 1, args.cache_dir)
    print(f"text: {toks.size:,} tokens of CPython's tests; ngramcache {nc.__version__}", file=sys.stderr)

    peers = {"llama-cpp-python PLD": llama_cpp_pld, "transformers PLD": transformers_pld,
             "ngram-simple scan (Python)": ngram_simple_scan}
    rows: dict[str, dict[int, float]] = {}
    missing = {}
    for L in contexts:
        print(f"context {L:,}", file=sys.stderr)
        # alternate: each proposer once per context, peers between ngramcache's drafters
        for peer, fn in peers.items():
            if peer in missing:
                continue
            try:
                res = fn(toks, L, args.steps, args.budget)
            except ImportError as e:
                missing[peer] = str(e)
                continue
            times = res[0] if isinstance(res, tuple) else res
            rows.setdefault(peer, {})[L] = median_us(times)
            if peer == "llama-cpp-python PLD" and "pld" in names:
                ours = ngc_python("pld", toks, L, len(res[1]), 1e9)[1]  # the same steps
                bad = [j for j, (a, b) in enumerate(zip(ours, res[1])) if not np.array_equal(a, b)]
                if bad:
                    raise SystemExit(f"pld differs from llama-cpp-python at context {L} + {bad[0]}: "
                                     f"{ours[bad[0]].tolist()} vs {res[1][bad[0]].tolist()}")
        for name in names:
            times, _, propose_times = ngc_python(name, toks, L, args.steps, args.budget)
            rows.setdefault(f"ngramcache {name}: step", {})[L] = median_us(times)
            rows.setdefault(f"ngramcache {name}: propose only", {})[L] = median_us(propose_times)
            core = ngc_core(name, toks, L, args.steps, args.budget)
            if core is not None:
                rows.setdefault(f"ngramcache {name}: core step", {})[L] = median_us(core)

    for peer, why in missing.items():
        print(f"left out {peer}: {why}", file=sys.stderr)
    ref_l = 32768 if 32768 in contexts else contexts[-1]
    peer_rows = [p for p in peers if p in rows]
    head = "| proposer | " + " | ".join(f"{L // 1024}k µs" for L in contexts) + " | " + " | ".join(
        f"vs {p} at {ref_l // 1024}k" for p in peer_rows) + " |"
    print(head)
    print("|" + "---|" * (1 + len(contexts) + len(peer_rows)))
    for name, vals in rows.items():
        cells = [f"{vals[L]:,.2f}" if L in vals else "-" for L in contexts]
        ratios = [f"{rows[p][ref_l] / vals[ref_l]:,.0f}x" if ref_l in vals and ref_l in rows[p] else "-"
                  for p in peer_rows]
        print(f"| {name} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    if args.json:
        args.json.write_text(json.dumps({"contexts": contexts, "rows": rows, "left_out": missing}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
