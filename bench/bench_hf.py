"""transformers' generate with ngramcache's drafters, against plain generate and transformers' own
prompt lookup, on the end-to-end workloads.

    .venv/bin/python bench/bench_hf.py                         # SmolLM2, 5 workloads, 3 rounds
    .venv/bin/python bench/bench_hf.py --quick                 # smoke test: tiny sizes
    .venv/bin/python bench/bench_hf.py --models smollm2,gemma --tokens 128 --repeats 3 --json out.json

The model is the packaged GGUF file, loaded by transformers itself and dequantised to float32
on the CPU (``ngramcache.integrations.hf.load_model``). The workloads are bench_e2e.py's
(``ngramcache.data.bench_tasks``: summarise, edit code, RAG quote, conversation, open-ended),
as raw prompts.

Variants, all greedy, in one process, order rotating between rounds, median of the rounds:

  plain         model.generate without drafts
  hf-pld-10     model.generate(prompt_lookup_num_tokens=10): transformers' prompt lookup
  ngc           ngramcache.integrations.hf.generate with ngramcache's default drafter (CopyDrafter) and the
                adaptive draft length from this model's measured verification costs (up to 32)
  ngc-fixed10   CopyDrafter, always up to 10 tokens (transformers' prompt lookup's budget)
  suffix, lookup, pld, simple, map-k, mod
                the other drafters of ngramcache.drafters.catalog with the adaptive draft length
  oracle        proposes the true continuation (plain's output) with the draft length that
                maximises (k+1)/cost(k+1), k <= 32: the ceiling with the same verification costs

Per variant: tokens/s end to end (prompt included, as generate returns) and for the generated
tokens alone (the plain prompt pass subtracted), tokens per forward pass, drafted and accepted
tokens, and the share of the wall time spent drafting. Also the measured cost of verifying
k = 1..33 tokens after a 512-token context, relative to one.
Never run it while another model process is running: timings would mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.generation import candidate_generator as hf_cg  # noqa: E402

import ngramcache as nc  # noqa: E402
from e2e_common import add_run_arguments, chosen_tasks, chosen_variants, report, speed_rows  # noqa: E402
from ngramcache import data, hf  # noqa: E402

VARIANTS = ("plain", "hf-pld-10", "ngc", "ngc-fixed10", "suffix", "lookup", "pld", "simple", "map-k", "mod", "oracle")
# the llama.cpp drafters with their parameters sized for short generations, as in bench_e2e.py
OPTIONS = {
    "simple": {"size_n": 3, "size_m": 16},
    "map-k": {"size_n": 3, "size_m": 16},
    "mod": {"n_match": 8, "n_min": 1, "n_max": 16},
    "pld": {"max_ngram": 3, "min_ngram": 1},
}
N_DRAFT = 32  # the most tokens the adaptive variants draft (ngramcache.integrations.hf's default)


class Recorder:
    """Drafts proposed (lengths) and the time spent in candidate generators."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.drafted = 0
        self.proposals = 0
        self.seconds = 0.0


REC = Recorder()


def instrument(cls) -> None:
    """Wraps ``cls.get_candidates`` and ``cls.update_candidate_strategy`` to count drafted
    tokens and time (the same bookkeeping for transformers' generator and ngramcache's)."""
    get, update = cls.get_candidates, cls.update_candidate_strategy

    def get_candidates(self, input_ids, *a, **k):
        t = time.perf_counter()
        out = get(self, input_ids, *a, **k)
        REC.seconds += time.perf_counter() - t
        REC.drafted += out[0].shape[1] - input_ids.shape[1]
        REC.proposals += 1
        return out

    def update_candidate_strategy(self, *a, **k):
        t = time.perf_counter()
        update(self, *a, **k)
        REC.seconds += time.perf_counter() - t

    cls.get_candidates = get_candidates
    cls.update_candidate_strategy = update_candidate_strategy


instrument(hf_cg.PromptLookupCandidateGenerator)
instrument(hf.DrafterCandidateGenerator)


def oracle_draft_len(costs, n_max: int) -> int:
    ks = range(1, min(n_max, len(costs) - 1) + 1)
    return max(ks, key=lambda k: (k + 1) / costs[k])


def run_variant(model, name: str, ids, n_tokens: int, costs, counter, truth=None) -> tuple[torch.Tensor, float, dict]:
    kw = {"max_new_tokens": n_tokens, "do_sample": False}
    REC.reset()
    counter[0] = 0
    t = time.perf_counter()
    if name == "plain":
        out = model.generate(ids, **kw)
    elif name == "hf-pld-10":
        out = model.generate(ids, prompt_lookup_num_tokens=10, **kw)
    else:
        if name == "ngc":
            d = hf.adaptive_drafter(model, None, n_draft=N_DRAFT, costs=costs)
        elif name == "oracle":
            d = nc.OracleDrafter(truth, n_draft=oracle_draft_len(costs, N_DRAFT))
        elif name == "ngc-fixed10":
            d = nc.CopyDrafter(n_draft=10)
        else:
            d = hf.adaptive_drafter(model, name, n_draft=N_DRAFT, costs=costs, **OPTIONS.get(name, {}))
        out = hf.generate(model, ids, d, **kw)
    dt = time.perf_counter() - t
    n_new = out.shape[1] - ids.shape[1]
    forwards = counter[0]
    # every forward pass yields one token of the model's own plus the drafted tokens it accepted
    return out, dt, {"forwards": forwards, "drafted": REC.drafted, "accepted": n_new - forwards,
                     "draft_s": REC.seconds}


def prefill_seconds(model, ids, repeats: int = 3) -> float:
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            t = time.perf_counter()
            # reading a value waits for the work a GPU still has queued
            model(ids, use_cache=True, logits_to_keep=1).logits.sum().item()
            best = min(best, time.perf_counter() - t)
    return best


def run_model(name: str, tasks, n_tokens: int, repeats: int, variants, log, loaded=None) -> dict:
    """Every variant on every task; ``loaded``: (model, tokenizer) already loaded (on any
    device, any dtype) instead of ``hf.load_model(name)``."""
    t = time.perf_counter()
    model, tok = hf.load_model(name) if loaded is None else loaded
    log(f"[{name}] loaded {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M "
        f"parameters, {model.dtype}) in {time.perf_counter() - t:.0f} s; torch threads {torch.get_num_threads()}")
    counter = [0]
    model.register_forward_pre_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    costs = hf.calibrate(model, max_batch=N_DRAFT + 1, n_context=512)
    rel = [c / costs[0] for c in costs]
    log(f"[{name}] verify costs after 512 tokens (x one token): {[round(x, 2) for x in rel]}")
    results = {}
    for task in tasks:
        ids = tok(task.prompt, return_tensors="pt")["input_ids"].to(model.device)
        n_prompt = ids.shape[1]
        ref, _, _ = run_variant(model, "plain", ids, n_tokens, costs, counter)  # warm-up and the truth
        truth = ref[0, n_prompt:].cpu().numpy()
        pre = prefill_seconds(model, ids)
        rows = {v: [] for v in variants}
        for r in range(repeats):
            order = list(variants[r % len(variants):]) + list(variants[: r % len(variants)])
            for v in order:
                out, dt, figs = run_variant(model, v, ids, n_tokens, costs, counter, truth)
                same = out.shape == ref.shape and bool(torch.equal(out, ref))
                if not same:
                    n = min(out.shape[1], ref.shape[1])
                    diff = (out[0, :n] != ref[0, :n]).nonzero()
                    figs["first_divergence"] = int(diff[0, 0]) - n_prompt if diff.numel() else n - n_prompt
                figs.update(seconds=dt, identical=same, n_new=int(out.shape[1] - n_prompt))
                rows[v].append(figs)
        row = {}
        for v, rs in rows.items():
            sec = statistics.median(x["seconds"] for x in rs)
            n_new = rs[0]["n_new"]
            gen = max(sec - pre, 1e-9)
            row[v] = {"e2e_tok_s": n_new / sec, "gen_tok_s": n_new / gen, "seconds": sec, "n_new": n_new,
                      "tokens_per_forward": n_new / rs[0]["forwards"], "drafted": rs[0]["drafted"],
                      "accepted": rs[0]["accepted"],
                      "draft_share": statistics.median(x["draft_s"] / x["seconds"] for x in rs),
                      "identical": all(x["identical"] for x in rs),
                      "first_divergence": next((x["first_divergence"] for x in rs if "first_divergence" in x), None)}
        results[task.name] = {"n_prompt": n_prompt, "prefill_s": pre, "variants": row}
        p = row["plain"]
        log(f"[{name}] {task.name}: prompt {n_prompt} tok, {p['n_new']} new; plain {p['gen_tok_s']:.1f} tok/s; "
            + ", ".join(f"{v} {row[v]['gen_tok_s'] / p['gen_tok_s']:.2f}x" for v in variants[1:]))
    return {"model": type(model).__name__, "dtype": str(model.dtype).removeprefix("torch."), "costs": costs,
            "tasks": results}


def markdown(all_results: dict, key: str, variants) -> str:
    lines = []
    for model, res in all_results.items():
        what = "generated tokens (prompt pass subtracted)" if key == "gen_tok_s" else "end to end (prompt included)"
        lines.append(f"\n**{model}** ({res['model']}, {res.get('dtype', 'float32')}), {what}: tok/s and speedup over plain\n")
        lines.extend(speed_rows(res, variants, key))
        if key == "gen_tok_s":
            lines.append("\nngramcache's default (ngc) against transformers' prompt lookup: " + ", ".join(
                f"{t} {tr['variants']['ngc'][key] / tr['variants']['hf-pld-10'][key]:.2f}x"
                for t, tr in res["tasks"].items() if "hf-pld-10" in tr["variants"] and "ngc" in tr["variants"]))
            lines.append("\naccepted/drafted, tokens per forward pass, drafting share of the wall time:\n")
            lines.append("| workload | " + " | ".join(variants[1:]) + " |")
            lines.append("|---|" + "---:|" * (len(variants) - 1))
            for task, tr in res["tasks"].items():
                v = tr["variants"]
                lines.append(f"| {task} | " + " | ".join(
                    f"{v[n]['accepted']}/{v[n]['drafted']}, {v[n]['tokens_per_forward']:.2f}, "
                    f"{100 * v[n]['draft_share']:.2f}%" for n in variants[1:]) + " |")
            lines.append("\nverify cost of k tokens after 512 (x one token): "
                         + ", ".join(f"{k}: {res['costs'][k - 1] / res['costs'][0]:.2f}" for k in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 33)
                                   if k <= len(res["costs"])))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(ap, "smollm2", "most tokens generated per run")
    ap.add_argument("--variants", default="all", help="comma list (plain is always run), or all: " + ",".join(VARIANTS))
    ap.add_argument("--quick", action="store_true", help="smoke test: 16 tokens, 1 round, 2 workloads, 3 variants")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.repeats = 16, 1
        if args.variants == "all":
            args.variants = "hf-pld-10,ngc"
    variants = chosen_variants(ap, args.variants, VARIANTS, {"plain"})
    tasks = chosen_tasks(data.bench_tasks(), args.workloads, args.quick)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    all_results = {m: run_model(m, tasks, args.tokens, args.repeats, variants, log) for m in args.models.split(",")}
    report(all_results, variants,
           f"\ntransformers {transformers.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
           f"at most {args.tokens} new tokens per run, greedy, median of {args.repeats} rounds; "
           "≠@i: output differs from plain greedy from token i", markdown, args.json,
           {"args": vars(args), "transformers": transformers.__version__})
    return 0


if __name__ == "__main__":
    sys.exit(main())
