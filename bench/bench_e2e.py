"""End-to-end benchmark: a real model verifying drafts, tokens per second.

    .venv/bin/python bench/bench_e2e.py                      # full: both models, 5 workloads
    .venv/bin/python bench/bench_e2e.py --quick              # smoke test: tiny sizes
    .venv/bin/python bench/bench_e2e.py --models gemma --tokens 96 --repeats 3 --json out.json

Workloads (``ngramcache.data``, real text already on the machine, nothing written for this):
summarise a long document (GPL-3), edit a function (stdlib ``posixpath.relpath``), answer by
quoting a passage (RAG over GPL-3), a three-turn edit conversation (stdlib ``shlex.quote``,
``textwrap.dedent``), and an open-ended control prompt.

Variants, all greedy, in one process, order alternating between rounds, median of the rounds:

  plain         ngramcache's loop without drafts (one token per decode)
  lcpp-plain    llama-cpp-python's own loop without drafts (parity check of the baseline)
  pld-10        llama-cpp-python LlamaPromptLookupDecoding, its defaults (num_pred_tokens=10)
  pld-2         the same with num_pred_tokens=2 (its README's advice for CPUs)
  fixed8-lcpp   llama.cpp's lookup drafts (LookupDrafter, always up to 8) in llama-cpp-python's
                loop (Llama(draft_model=LlamaDrafter(...)), logits_all)
  fixed8        the same drafts in ngramcache's loop: the two loops compared on equal drafts
  lookup        llama.cpp's lookup drafts (context cache only), adaptive draft length (up to --n-draft)
  ngc           ngramcache's default drafter: copies of earlier spans, else llama.cpp's lookup
                (CopyDrafter), adaptive draft length
  ngc-unbounded the same without the gate's bound on what one draft may lose (risk=None)
  ngc+static    ngramcache with a static table built from ~2 MB of other stdlib code
  suffix        SuffixDrafter (docs/drafters.md), adaptive draft length
  simple, map-k, mod
                llama.cpp's ngram-simple (size_n 3, size_m 16), ngram-map-k (3, 16) and
                ngram-mod (n_match 8, n_min 1, n_max 16), exactly, adaptive draft length
  pld           plain prompt lookup (PromptLookupDrafter, max_ngram 3), adaptive draft length
  oracle        proposes the true continuation (from the plain run) with the draft length
                that maximises (k+1)/cost(k+1): the ceiling with the same verification costs

Prints markdown tables (generation alone, and end to end with the prompt) for RESULTS.md.
Never run it while another model process is running: timings would mean nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import ngramcache as nc  # noqa: E402
from e2e_common import add_run_arguments, chosen_tasks, chosen_variants, report, speed_rows  # noqa: E402
from ngramcache import data  # noqa: E402
from ngramcache import llama as nl  # noqa: E402
from ngramcache.decoding.gate import Gate, GatedDrafter, GateSettings  # noqa: E402
from ngramcache.drafters.catalog import make_drafter  # noqa: E402
from ngramcache.models import model_path  # noqa: E402

VARIANTS = ("plain", "lcpp-plain", "pld-10", "pld-2", "fixed8-lcpp", "fixed8", "lookup", "ngc", "ngc-unbounded", "ngc+static",
            "suffix", "simple", "map-k", "mod", "pld", "oracle")
# every drafter of ngramcache.drafters.catalog, with the adaptive gate, in ngramcache's loop; the
# llama.cpp drafters with their own parameters sized for short generations (their
# server defaults, n-grams of 12-24 tokens, seldom match within 128 tokens)
CATALOG_VARIANTS = {
    "suffix": ("suffix", {}),
    "simple": ("simple", {"size_n": 3, "size_m": 16}),
    "map-k": ("map-k", {"size_n": 3, "size_m": 16}),
    "mod": ("mod", {"n_match": 8, "n_min": 1, "n_max": 16}),
    "pld": ("pld", {"max_ngram": 3, "min_ngram": 1}),
}
# files whose text the workloads quote: kept out of the static corpus
EXCLUDE = {"posixpath.py", "textwrap.py", "shlex.py", "genericpath.py"}


def static_corpus_text(limit_bytes: int) -> str:
    root = Path(data.stdlib_dir())
    parts, n = [], 0
    for p in sorted(root.glob("*.py")):
        if p.name in EXCLUDE:
            continue
        try:
            t = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(t)
        n += len(t)
        if n >= limit_bytes:
            break
    return "".join(parts)[:limit_bytes]


def static_tokens(llm, model_path: str, limit_bytes: int) -> np.ndarray:
    """The static corpus in this model's tokens, cached in the temp folder."""
    tag = hashlib.sha1(f"{model_path}|{os.path.getsize(model_path)}|{limit_bytes}|{sys.version}".encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"ngramcache-e2e-static-{tag}.npy"
    if path.exists():
        return np.load(path)
    text = static_corpus_text(limit_bytes)
    toks = []
    piece = 32_000  # Gemma 3's tokenizer slows down on long inputs
    for s in range(0, len(text), piece):
        toks.extend(llm.tokenize(text[s : s + piece].encode("utf-8"), add_bos=False, special=False))
    arr = np.asarray(toks, dtype=np.int32)
    np.save(path, arr)
    return arr


def oracle_draft_len(costs: list[float], n_max: int) -> int:
    c = np.asarray(costs) / costs[0]
    ks = np.arange(1, min(n_max, c.size - 1) + 1)
    return int(ks[np.argmax((ks + 1) / c[ks])])


def run_model(name: str, model_path: str, tasks, n_tokens: int, repeats: int, n_draft: int,
              static_bytes: int, threads: int | None, log, variants=VARIANTS, exact: bool = True) -> dict:
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    llm = nl.make_llama(model_path, n_ctx=4096, n_threads=threads, exact=exact)
    be = nl.LlamaBackend.of(llm)
    n_prompts = [len(be.tokenize(t.prompt)) for t in tasks]
    n_ctx = max(n_prompts) + n_tokens + 32
    llm_pld = nl.make_llama(model_path, drafter=LlamaPromptLookupDecoding(), n_ctx=n_ctx, n_threads=threads,
                            exact=exact)
    # llama-cpp-python's loop decodes [token + draft] with n_batch rows at most
    assert llm_pld.n_batch >= n_draft + 1
    # the model's cost curve as the commands get it (stored, else the prior for its size), learnt
    # further by every gated run below
    learnt = nl.learned_costs(llm, max_batch=n_draft + 1)
    costs = list(learnt.curve())
    log(f"[{name}] verify costs (x one token; {learnt.describe()}): {[round(x, 2) for x in costs]}")

    def gated(drafter, **settings):
        return GatedDrafter(drafter, Gate(learnt, GateSettings(**settings)))

    t = time.perf_counter()
    st_tokens = static_tokens(llm, model_path, static_bytes)
    static = nc.StaticTable.build(st_tokens, 2)
    log(f"[{name}] static table: {st_tokens.size:,} tokens, {len(static):,} keys ({time.perf_counter() - t:.1f} s)")
    k_oracle = oracle_draft_len(costs, n_draft)

    results = {}
    for task, n_prompt in zip(tasks, n_prompts):
        plain0 = nl.generate(llm, task.prompt, None, n_tokens)  # warm-up and the oracle's truth
        truth = plain0.tokens
        # batched verification can flip a near tie: then the oracle's own output is the
        # continuation it can follow (iterate to a fixed point, at most 3 times)
        oracle_truth = truth
        for _ in range(3):
            o = nl.generate(llm, task.prompt, nc.OracleDrafter(oracle_truth, n_draft=k_oracle), n_tokens)
            if o.tokens.tolist() == oracle_truth.tolist():
                break
            oracle_truth = o.tokens
        runs = {v: [] for v in variants}
        for r in range(repeats):
            order = variants if r % 2 == 0 else variants[::-1]
            for v in order:
                if v == "plain":
                    res = nl.generate(llm, task.prompt, None, n_tokens)
                elif v == "lcpp-plain":
                    res = nl.generate_llama_cpp(llm, task.prompt, n_tokens)
                elif v in ("pld-10", "pld-2"):
                    npt = 10 if v == "pld-10" else 2
                    llm_pld.draft_model = nl.CountingDraftModel(LlamaPromptLookupDecoding(num_pred_tokens=npt))
                    res = nl.generate_llama_cpp(llm_pld, task.prompt, n_tokens)
                elif v == "fixed8-lcpp":
                    llm_pld.draft_model = nl.CountingDraftModel(nl.LlamaDrafter(nc.LookupDrafter(n_draft=8)))
                    res = nl.generate_llama_cpp(llm_pld, task.prompt, n_tokens)
                elif v == "fixed8":
                    res = nl.generate(llm, task.prompt, nc.LookupDrafter(n_draft=8), n_tokens)
                elif v == "lookup":
                    res = nl.generate(llm, task.prompt, gated(nc.LookupDrafter(n_draft=n_draft)), n_tokens)
                elif v == "ngc":
                    res = nl.generate(llm, task.prompt, gated(nc.CopyDrafter(n_draft=n_draft)), n_tokens)
                elif v == "ngc-unbounded":
                    res = nl.generate(llm, task.prompt, gated(nc.CopyDrafter(n_draft=n_draft), risk=None), n_tokens)
                elif v == "ngc+static":
                    res = nl.generate(llm, task.prompt, gated(nc.CopyDrafter(static=static, n_draft=n_draft)),
                                      n_tokens)
                elif v in CATALOG_VARIANTS:
                    kind, opts = CATALOG_VARIANTS[v]
                    d = gated(make_drafter(kind, n_draft=n_draft, **opts))
                    res = nl.generate(llm, task.prompt, d, n_tokens)
                else:
                    res = nl.generate(llm, task.prompt, nc.OracleDrafter(oracle_truth, n_draft=k_oracle), n_tokens)
                runs[v].append(res)
        row = {}
        for v, rs in runs.items():
            ident = [r.tokens.tolist() == truth.tolist() for r in rs]
            div = None
            if not all(ident):
                a, b = truth.tolist(), rs[ident.index(False)].tokens.tolist()
                div = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            row[v] = {
                "gen_tok_s": statistics.median(r.gen_tokens_per_s for r in rs),
                "e2e_tok_s": statistics.median(r.e2e_tokens_per_s for r in rs),
                "prompt_s": statistics.median(r.t_prompt for r in rs),
                "draft_s": statistics.median(r.t_draft for r in rs),
                "tokens": rs[0].n_tokens, "drafted": rs[0].drafted, "accepted": rs[0].accepted,
                "identical": all(ident), "first_divergence": div,
            }
        results[task.name] = {"n_prompt": n_prompt, "variants": row}
        p = row["plain"]
        log(f"[{name}] {task.name}: prompt {n_prompt} tok; plain {p['gen_tok_s']:.1f} tok/s; " + ", ".join(
            f"{v} {row[v]['gen_tok_s'] / p['gen_tok_s']:.2f}x" for v in variants[1:]))
    llm_pld.close()
    llm.close()
    return {"model": os.path.basename(model_path), "costs": costs, "oracle_k": k_oracle, "tasks": results}


def markdown(all_results: dict, key: str, variants=VARIANTS) -> str:
    lines = []
    for model, res in all_results.items():
        lines.append(f"\n**{model}** ({res['model']}), {'generation only' if key == 'gen_tok_s' else 'end to end (prompt included)'}:"
                     f" tok/s, speedup over plain, share of the oracle's tok/s\n")
        lines.extend(speed_rows(res, variants, key))
        acc = []
        for task, tr in res["tasks"].items():
            v = tr["variants"]
            acc.append(f"{task}: " + ", ".join(
                f"{n} {v[n]['accepted']}/{v[n]['drafted']}" for n in variants if n not in ("plain", "lcpp-plain")))
        if key == "gen_tok_s":
            lines.append("\naccepted/drafted: " + "; ".join(acc))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(ap, "gemma,smollm2", "tokens generated per run")
    ap.add_argument("--n-draft", type=int, default=16, help="most tokens drafted per step by ngc (default 16)")
    ap.add_argument("--static-bytes", type=int, default=2_000_000, help="static corpus size (default 2 MB)")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--default-kernels", action="store_true",
                    help="load models with llama-cpp-python's defaults (weights repacked, tiled matmul on), "
                         "not the exact kernels: with a default build on PYTHONPATH, what exactness costs")
    ap.add_argument("--quick", action="store_true", help="smoke test: 16 tokens, 1 round, 2 workloads, 200 KB static")
    ap.add_argument("--variants", default="all",
                    help="comma list of variants (plain and oracle are always run), or all: " + ",".join(VARIANTS))
    args = ap.parse_args(argv)
    variants = chosen_variants(ap, args.variants, VARIANTS, {"plain", "oracle"})
    if args.quick:
        args.tokens, args.repeats, args.static_bytes = 16, 1, 200_000
    tasks = chosen_tasks(data.bench_tasks(), args.workloads, args.quick)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    all_results = {}
    for m in args.models.split(","):
        path = model_path(m)  # a packaged model's name or a GGUF file
        all_results[m] = run_model(m, path, tasks, args.tokens, args.repeats, args.n_draft, args.static_bytes,
                                   args.threads, log, variants, exact=not args.default_kernels)
    report(all_results, variants,
           f"\n{args.tokens} tokens per run, median of {args.repeats} rounds, "
           f"threads={args.threads or 'default'}, {'default' if args.default_kernels else 'exact'} kernels; "
           "≠@i: output differs from plain greedy from token i", markdown, args.json, {"args": vars(args)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
