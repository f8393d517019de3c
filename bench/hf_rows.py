"""Does transformers compute the same logits for a token in a batch as one token at a time?

    .venv/bin/python bench/hf_rows.py                            # rows and flips, every setting
    .venv/bin/python bench/hf_rows.py --settings default,eager --flip-prompts 10
    .venv/bin/python bench/hf_rows.py --quick                    # smoke test: tiny sizes
    .venv/bin/python bench/hf_rows.py --json rows.json

A draft verified by transformers is a batched forward pass over the drafted tokens, while
plain ``generate`` feeds one token per pass. Greedy drafting gives plain greedy output only if
the argmax of each row is the same either way. Two measurements, per setting:

rows   After a prompt of 300-600 tokens, greedy-decode ``--tokens`` tokens one pass per token,
       keeping each row of logits; then evaluate the same tokens again after the same prompt
       in chunks of ``--chunk``. Counts the rows that are bitwise equal, the largest absolute
       difference, and the rows whose argmax differs.
flips  On ``--flip-prompts`` prompts, plain greedy ``model.generate`` against
       ``ngramcache.integrations.hf.generate`` with a CopyDrafter (up to 16 tokens a draft):
       the prompts whose outputs differ, where they first differ and plain's top-2 logit gap
       there.

Settings (applied one at a time, then undone):

  default        as loaded: float32 on the CPU, transformers' default attention (sdpa)
  deterministic  torch.use_deterministic_algorithms(True)
  eager          the model's attention implementation set to "eager"
  threads1       torch.set_num_threads(1)
  mkldnn-off     torch.backends.mkldnn.enabled = False

The model is a packaged GGUF file loaded by ``ngramcache.integrations.hf.load_model``
(dequantised to float32). Prompts are windows of real text (prose and Python standard library
source, ``ngramcache.data``) followed by an instruction to repeat or continue them.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch  # noqa: E402

import ngramcache as nc  # noqa: E402
from ngramcache import data, hf  # noqa: E402
from ngramcache.files import atomic_open  # noqa: E402

SETTINGS = ("default", "deterministic", "eager", "threads1", "mkldnn-off")
CODE_FILES = ("posixpath.py", "textwrap.py", "shlex.py", "argparse.py", "json/decoder.py", "fnmatch.py",
              "glob.py", "tokenize.py", "shutil.py", "string.py")
ASKS = ("\n\nRepeat the text above word for word:\n\n", "\n\nContinue:\n",
        "\n\nQuestion: what is this about? Answer in one sentence.\nAnswer:")


def prompts(tokenizer, n: int, lo: int = 300, hi: int = 600) -> list[torch.Tensor]:
    """``n`` prompts of ``lo``..``hi`` tokens: alternately a window of prose and of stdlib
    source, cut to a whole number of tokens, then one of ASKS."""
    prose, _ = data.prose(60000)
    code = []
    for rel in CODE_FILES:
        with contextlib.suppress(OSError):
            with open(os.path.join(data.stdlib_dir(), rel), encoding="utf-8") as f:
                code.append(f.read())
    sources = [prose] + code
    out = []
    for i in range(n):
        text = sources[0] if i % 2 == 0 or len(sources) == 1 else sources[1 + (i // 2) % (len(sources) - 1)]
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        length = lo + (i * 37) % (hi - lo + 1)
        start = (i * 211) % max(1, len(ids) - length)
        body = tokenizer.decode(ids[start : start + length])
        ask = tokenizer(ASKS[i % len(ASKS)], add_special_tokens=False)["input_ids"]
        out.append(torch.tensor([tokenizer(body, add_special_tokens=False)["input_ids"] + ask]))
    return out


def forward(model, ids: torch.Tensor, previous=None):
    """One forward pass of ``ids`` after the KV cache of ``previous`` (an earlier output)."""
    if previous is None:
        return model(input_ids=ids, use_cache=True)
    # transformers 5 renamed past_key_values to cache, in the outputs as in the arguments
    if "cache" in inspect.signature(model.forward).parameters:
        return model(input_ids=ids, cache=previous.cache, use_cache=True)
    return model(input_ids=ids, past_key_values=previous.past_key_values, use_cache=True)


@torch.no_grad()
def one_at_a_time(model, ids: torch.Tensor, n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and the row of logits that chose each, one forward pass per token."""
    out = forward(model, ids)
    rows, tokens = [out.logits[0, -1].clone()], []
    for i in range(n):
        tokens.append(int(rows[-1].argmax()))
        if i == n - 1:
            break
        out = forward(model, torch.tensor([[tokens[-1]]], device=ids.device), out)
        rows.append(out.logits[0, -1].clone())
    return tokens, torch.stack(rows)


@torch.no_grad()
def in_chunks(model, ids: torch.Tensor, tokens: list[int], chunk: int) -> torch.Tensor:
    """The rows for the same tokens, the tokens fed ``chunk`` at a time after the prompt."""
    out = forward(model, ids)
    rows = [out.logits[0, -1].clone()]
    for s in range(0, len(tokens) - 1, chunk):
        out = forward(model, torch.tensor([tokens[s : min(s + chunk, len(tokens) - 1)]], device=ids.device), out)
        rows.extend(out.logits[0].clone())
    return torch.stack(rows)


def compare_rows(model, ps: list[torch.Tensor], n: int, chunk: int) -> dict:
    equal = total = flips = 0
    max_diff = 0.0
    for ids in ps:
        tokens, single = one_at_a_time(model, ids, n)
        batched = in_chunks(model, ids, tokens, chunk)
        # row 0 comes from the same prompt pass both ways; the rows after it are the test
        a, b = single[1:], batched[1:]
        equal += int(torch.all(a == b, dim=1).sum())
        total += a.shape[0]
        flips += int((a.argmax(dim=1) != b.argmax(dim=1)).sum())
        max_diff = max(max_diff, float((a - b).abs().max()))
    return {"rows": total, "bitwise_equal": equal, "max_abs_diff": max_diff, "argmax_flips": flips}


@torch.no_grad()
def compare_outputs(model, ps: list[torch.Tensor], n: int) -> dict:
    differ = []
    accepted = drafted = 0
    for k, ids in enumerate(ps):
        plain = model.generate(ids, max_new_tokens=n, do_sample=False, output_scores=True,
                               return_dict_in_generate=True)
        gen = hf.DrafterCandidateGenerator(nc.CopyDrafter(n_draft=16))
        spec = hf.generate(model, ids, gen, max_new_tokens=n, do_sample=False)
        drafted += gen.stats.drafted
        accepted += gen.stats.accepted
        a = plain.sequences[0, ids.shape[1]:].tolist()
        b = spec[0, ids.shape[1]:].tolist()
        if a != b:
            i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            gap = None
            if i < len(plain.scores):
                top2 = torch.topk(plain.scores[i][0], 2).values
                gap = float(top2[0] - top2[1])
            differ.append({"prompt": k, "first_difference": i, "plain_top2_gap": gap})
    return {"prompts": len(ps), "differ": len(differ), "where": differ, "drafted": drafted, "accepted": accepted}


@contextlib.contextmanager
def setting(model, name: str):
    """Apply one setting for the block, then put things back."""
    if name == "default":
        yield
    elif name == "deterministic":
        before = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(before)
    elif name == "eager":
        before = model.config._attn_implementation
        model.set_attn_implementation("eager")
        try:
            yield
        finally:
            model.set_attn_implementation(before)
    elif name == "threads1":
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(before)
    elif name == "mkldnn-off":
        before = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False
        try:
            yield
        finally:
            torch.backends.mkldnn.enabled = before
    else:
        raise ValueError(f"unknown setting {name!r}; the settings are {', '.join(SETTINGS)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="packaged model name or GGUF path (default: smollm2)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated, from: " + ", ".join(SETTINGS))
    ap.add_argument("--row-prompts", type=int, default=3, help="prompts for the row comparison (default: 3)")
    ap.add_argument("--tokens", type=int, default=48, help="tokens decoded per row prompt (default: 48)")
    ap.add_argument("--chunk", type=int, default=8, help="tokens per batched pass (default: 8)")
    ap.add_argument("--flip-prompts", type=int, default=30, help="prompts for the output comparison, 0 = skip (default: 30)")
    ap.add_argument("--flip-tokens", type=int, default=24, help="tokens generated per flip prompt (default: 24)")
    ap.add_argument("--flip-settings", metavar="LIST",
                    help="the settings whose outputs are compared (default: every one in --settings)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, to check that the script runs")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    names = [s for s in args.settings.split(",") if s]
    flip_names = names if args.flip_settings is None else [s for s in args.flip_settings.split(",") if s]
    for s in names + flip_names:
        if s not in SETTINGS:
            ap.error(f"unknown setting {s!r}; the settings are {', '.join(SETTINGS)}")
    names += [s for s in flip_names if s not in names]
    if args.quick:
        args.row_prompts, args.tokens, args.flip_prompts, args.flip_tokens = 1, 12, 2, 8
    for flag in ("row_prompts", "tokens", "chunk", "flip_tokens"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.flip_prompts < 0:
        ap.error("--flip-prompts must be >= 0")

    t0 = time.perf_counter()
    model, tokenizer = hf.load_model(args.model)
    print(f"loaded {args.model} in {time.perf_counter() - t0:.0f} s (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, attention {model.config._attn_implementation})", flush=True)
    row_ps = prompts(tokenizer, args.row_prompts)
    flip_ps = prompts(tokenizer, args.flip_prompts)
    results = {"model": args.model, "torch": torch.__version__, "tokens": args.tokens, "chunk": args.chunk,
               "flip_tokens": args.flip_tokens, "settings": {}}
    for name in names:
        t = time.perf_counter()
        with setting(model, name):
            r = {"rows": compare_rows(model, row_ps, args.tokens, args.chunk)}
            if flip_ps and name in flip_names:
                r["flips"] = compare_outputs(model, flip_ps, args.flip_tokens)
        results["settings"][name] = r
        rows = r["rows"]
        line = (f"{name:14s} rows bitwise equal {rows['bitwise_equal']}/{rows['rows']}, "
                f"max |diff| {rows['max_abs_diff']:.3g}, argmax flips {rows['argmax_flips']}")
        if "flips" in r:
            f = r["flips"]
            line += (f"; outputs differ on {f['differ']}/{f['prompts']} prompts "
                     f"(drafted {f['drafted']}, accepted {f['accepted']})")
        print(f"{line}  [{time.perf_counter() - t:.0f} s]", flush=True)
        for w in r.get("flips", {}).get("where", []):
            gap = "-" if w["plain_top2_gap"] is None else f"{w['plain_top2_gap']:.3g}"
            print(f"{'':14s}   prompt {w['prompt']}: first difference at token {w['first_difference']}, "
                  f"plain's top-2 gap there {gap}")
    if args.json:
        with atomic_open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
