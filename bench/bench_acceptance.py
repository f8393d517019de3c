"""Acceptance of every drafter on the same token streams, without a model in the loop.

    .venv/bin/python bench/bench_acceptance.py [--models gemma,smollm2] [--tokens 128] [--n-draft 16]
                                               [--json out.json]

Greedy speculative decoding emits exactly the model's plain greedy output, so a drafter's
proposals can be judged offline against that output: every drafter is replayed over (prompt,
plain greedy continuation) pairs, proposing up to ``--n-draft`` tokens per step; the longest
matching prefix is accepted, plus the model's own next token, as a verify step would. The
figure that decides speed on a memory-bound CPU is **tokens per verify step** (accepted + 1,
averaged over the steps). No gate: the proposals themselves are measured.

Workloads:
  * the five e2e workloads of ``ngramcache.data.bench_tasks()`` (summary, code edit, RAG
    quote, three-turn conversation, open-ended), continued ``--tokens`` tokens by each model
    with plain greedy decoding (computed once per model and cached in the temp folder);
  * a multi-request trace: one real stdlib module (``shlex.py``'s ``split``, ``quote`` and
    ``join``) edited in six successive requests (rename a variable, drop the comments, rename
    a function, add a guard, ...). Request i's prompt is the current code plus the
    instruction; its answer is the next version (the edit applied by this script), tokenized
    with each model's tokenizer. Drafters that remember across requests are handed every
    request in turn: ``suffix`` with a shared ``SuffixStore``, ``mod`` with its table,
    ``lookup``/``copy`` with a dynamic cache merged after each request.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import ngramcache as nc  # noqa: E402
from ngramcache import data  # noqa: E402
from ngramcache import llama as nl  # noqa: E402
from ngramcache.drafters.catalog import make_drafter  # noqa: E402
from ngramcache.models import model_path  # noqa: E402

# (label, catalog name, options); the llama.cpp drafters also with the sizes bench_e2e.py uses
VARIANTS = [
    ("lookup", "lookup", {}),
    ("copy", "copy", {}),
    ("suffix", "suffix", {}),
    ("pld", "pld", {}),
    ("simple 12/48", "simple", {}),
    ("simple 3/16", "simple", {"size_n": 3, "size_m": 16}),
    ("map-k 12/48", "map-k", {}),
    ("map-k 3/16", "map-k", {"size_n": 3, "size_m": 16}),
    ("map-k4v 3/16", "map-k4v", {"size_n": 3, "size_m": 16}),
    ("mod 24/48/64", "mod", {}),
    ("mod 8/1/16", "mod", {"n_match": 8, "n_min": 1, "n_max": 16}),
]


def replay_request(d, prompt: np.ndarray, answer: np.ndarray, n_draft: int) -> dict:
    """One request: reset with the prompt, then verify steps until the answer is out."""
    d.reset(prompt)
    pos = steps = drafted = accepted = 0
    while pos < answer.size:
        p = d.propose(n_draft)
        acc = 0
        while acc < p.size and pos + acc < answer.size and p[acc] == answer[pos + acc]:
            acc += 1
        n_new = min(acc + 1, answer.size - pos)
        d.accept(answer[pos : pos + n_new])
        pos += n_new
        steps += 1
        drafted += int(p.size)
        accepted += acc
    return {"tokens": int(answer.size), "steps": steps, "drafted": drafted, "accepted": accepted}


def add(a: dict, b: dict) -> dict:
    return {k: a.get(k, 0) + b[k] for k in b}


def plain_outputs(name: str, path: str, tasks, n_tokens: int, log) -> list[tuple[np.ndarray, np.ndarray]]:
    tag = hashlib.sha1(json.dumps([path, n_tokens, [t.prompt for t in tasks]]).encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"ngramcache-acceptance-{name}-{tag}.npz"
    llm = nl.make_llama(path, n_ctx=4096)
    be = nl.LlamaBackend.of(llm)
    if cache.exists():
        z = np.load(cache)
        pairs = [(z[f"p{i}"], z[f"a{i}"]) for i in range(len(tasks))]
    else:
        pairs = []
        for t in tasks:
            res = nl.generate(llm, t.prompt, None, n_tokens)
            pairs.append((be.tokenize(t.prompt), res.tokens))
            log(f"[{name}] {t.name}: {res.n_tokens} tokens of plain greedy output")
        np.savez(cache, **{f"p{i}": p for i, (p, _) in enumerate(pairs)},
                 **{f"a{i}": a for i, (_, a) in enumerate(pairs)})
    return pairs, be


def edit_trace() -> list[tuple[str, str]]:
    """(prompt, answer) of six successive edits of real code."""
    code = "\n\n".join(data.stdlib_function("shlex.py", f) for f in ("split", "join", "quote"))
    edits = [
        ("Rename the parameter s to text.", lambda c: re.sub(r"\bs\b", "text", c)),
        ("Remove every comment.", lambda c: re.sub(r"\n\s*#[^\n]*", "", c)),
        ("Rename the function quote to shell_quote.", lambda c: re.sub(r"\bquote\b", "shell_quote", c)),
        ("Raise TypeError when text is not a str, at the start of shell_quote.",
         lambda c: c.replace('    """Return a shell-escaped version of the string *text*."""\n',
                             '    """Return a shell-escaped version of the string *text*."""\n'
                             '    if not isinstance(text, str):\n        raise TypeError("text must be a str")\n')),
        ("Rename split_command to command in join.", lambda c: re.sub(r"\bsplit_command\b", "command", c)),
        ("Use double quotes for the empty string.", lambda c: c.replace("return \"''\"", "return '\"\"'")),
    ]
    out = []
    for instruction, fn in edits:
        new = fn(code)
        prompt = (f"User: Here is the current code.\n\n```python\n{code}\n```\n\n{instruction} Reply with the "
                  "whole code.\n\nAssistant:\n\n```python\n")
        out.append((prompt, new + "\n```\n"))
        code = new
    return out


def run_model(name: str, n_tokens: int, n_draft: int, log) -> dict:
    path = model_path(name)
    tasks = data.bench_tasks()
    pairs, be = plain_outputs(name, path, tasks, n_tokens, log)
    answer = lambda a: np.asarray(be.llm.tokenize(a.encode(), add_bos=False, special=False), dtype=np.int32)  # noqa: E731
    trace = [(be.tokenize(p), answer(a)) for p, a in edit_trace()]
    res = {"workloads": {}, "trace": {}}
    for label, kind, opts in VARIANTS:
        for t, (p, a) in zip(tasks, pairs):
            d = make_drafter(kind, n_draft=n_draft, **opts)
            res["workloads"].setdefault(t.name, {})[label] = replay_request(d, p, a, n_draft)
        # the trace: one drafter (and its cross-request memory) for every request
        extra = {}
        if kind == "suffix":
            extra = {"store": nc.SuffixStore()}
        elif kind in ("lookup", "copy"):
            extra = {"dynamic": nc.NgramCache()}
        d = make_drafter(kind, n_draft=n_draft, **opts, **extra)
        tot = {}
        for p, a in trace:
            tot = add(tot, replay_request(d, p, a, n_draft))
            if kind in ("lookup", "copy"):
                d.dynamic.merge(d.context)
        res["trace"][label] = tot
    return res


def per_step(r: dict) -> float:
    return r["tokens"] / r["steps"] if r["steps"] else 0.0


def markdown(name: str, res: dict) -> str:
    cols = list(res["workloads"]) + ["edit trace (6 requests)"]
    rows = [f"\n**{name}**: tokens per verify step (accepted + 1); acceptance of drafted tokens in brackets\n",
            "| drafter | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for label, _, _ in VARIANTS:
        cells = []
        for w in res["workloads"].values():
            r = w[label]
            cells.append(f"{per_step(r):.2f} ({100 * r['accepted'] / max(1, r['drafted']):.0f} %)")
        r = res["trace"][label]
        cells.append(f"{per_step(r):.2f} ({100 * r['accepted'] / max(1, r['drafted']):.0f} %)")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gemma,smollm2")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--n-draft", type=int, default=16)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    out = {}
    for name in args.models.split(","):
        out[name] = run_model(name, args.tokens, args.n_draft, log)
        print(markdown(name, out[name]))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
