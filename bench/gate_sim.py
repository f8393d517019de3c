"""The drafting gate against a model's real greedy outputs, with a modelled clock.

On an exact build a drafted run emits the same tokens as plain decoding, so how a drafter and
its gate would do on a prompt is fixed by two things: the plain output (what verification
would confirm) and the model's verification cost curve (what a batch of k tokens costs). This
tool records the first once per model (``collect``: real plain runs through llama-cpp-python
on the benchmark workloads), then replays each record with the gated replay of the compiled
core (``ngramcache.replays.replay_drafter(..., gate=...)``, what ``ngramcache stats --drafter
NAME --gate`` runs): the drafter is reset with the prompt and the first output token (the
prompt pass gives it), and at every step the gate decides how many of the proposal's tokens
are verified. A step that verifies k drafted tokens costs cost(k+1), a plain step 1: the
speed-up over plain does not drift with machine noise, for every workload at once, in
seconds. The gate decides on the curve as given (a replay has no verification times to learn
it from). ``bench/make_gate_priors.py`` fits the gate's priors from the same records.

    .venv/bin/python bench/gate_sim.py collect --models smollm2,gemma --tokens 128 --out /tmp/gate-sim
    .venv/bin/python bench/gate_sim.py simulate --dir /tmp/gate-sim --models smollm2,gemma
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from ngramcache.decoding import costs as _costs  # noqa: E402
from ngramcache.decoding.gate import GateSettings, Priors  # noqa: E402
from ngramcache.drafters.catalog import make_drafter  # noqa: E402
from ngramcache.replays import replay_drafter  # noqa: E402

from bench_chat import TURNS as CHAT_TURNS  # noqa: E402  (the chat benchmark's four turns)
from bench_chat import resolve_model as model_path  # noqa: E402  (packaged models, and qwen-coder)
FRESH_CODE = ("Write a Python function that parses a date in the form YYYY-MM-DD and returns the "
              "day of the week as a word. Give only the code.")


def collect(models: list[str], n_tokens: int, out_dir: Path) -> None:
    from ngramcache import llama as nl
    from ngramcache.data import bench_tasks
    from ngramcache.serving.engine import _llama_parts

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in models:
        llm = nl.make_llama(model_path(name), n_ctx=4096, n_batch=512, n_threads=1, n_threads_batch=1)
        be, chat_tokens, template = _llama_parts(llm, None)
        records = []
        for task in bench_tasks():
            r = nl.generate(llm, task.prompt, None, n_tokens)
            records.append({"workload": task.name, "prompt": be.tokenize(task.prompt).tolist(),
                            "output": r.tokens.tolist()})
            print(name, task.name, r.n_tokens, flush=True)
        for label, turns in (("fresh code (chat)", [FRESH_CODE]), ("chat", CHAT_TURNS)) if template else ():
            messages: list[dict] = []
            for i, text in enumerate(turns):
                messages.append({"role": "user", "content": text})
                prompt = chat_tokens(template.render(messages))
                r = nl.generate(llm, prompt, None, 2 * n_tokens)
                messages.append({"role": "assistant", "content": r.text})
                records.append({"workload": label if len(turns) == 1 else f"{label} turn {i + 1}",
                                "prompt": prompt.tolist(), "output": r.tokens.tolist()})
                print(name, records[-1]["workload"], r.n_tokens, flush=True)
        (out_dir / f"{name}.json").write_text(json.dumps({"model": name, "n_vocab": be.n_vocab,
                                                         "records": records}))
        del llm


def replay_record(rec: dict, drafter: str, n_draft: int, gate, costs=None):
    """The gated replay of one record (``ReplayStats``, None for an output of fewer than two
    tokens: no step to replay). The stream is the prompt, the output and one token more (a
    replayed chunk needs one after it; it is never read), one chunk whose prompt is the
    record's prompt and first output token. ``gate``: a ``GateSettings`` (with ``costs``) or
    a ``Gate`` that goes on learning."""
    prompt, output = rec["prompt"], rec["output"]
    if len(output) < 2:
        return None
    tokens = np.asarray(prompt + output + [0], dtype=np.int32)
    return replay_drafter(tokens, make_drafter(drafter, n_draft=n_draft), len(prompt) + len(output), n_draft,
                          gate=gate, costs=costs, n_prompt=len(prompt) + 1)


def simulate(models: list[str], in_dir: Path, costs_by_model: dict, drafters: list[str], n_draft: int,
             settings: GateSettings) -> dict:
    """{model: {workload: {drafter: (speed-up, accepted, drafted)}}}."""
    table = {}
    for name in models:
        data = json.loads((in_dir / f"{name}.json").read_text())
        curve = costs_by_model[name]
        rows = {}
        for rec in data["records"]:
            cells = {}
            for d in drafters:
                s = replay_record(rec, d, n_draft, settings, curve)
                if s is not None:
                    cells[d] = (s.gate.speedup, s.n_accept, s.n_drafted)
            rows[rec["workload"]] = cells
        table[name] = rows
    return table


def print_table(table: dict, drafters: list[str], summary: bool) -> None:
    for name, rows in table.items():
        if not summary:
            print(f"\n### {name}: modelled speed-up over plain, accepted/drafted\n")
            print("| workload | " + " | ".join(drafters) + " |")
            print("|---|" + "---:|" * len(drafters))
            for w, c in rows.items():
                print(f"| {w} | " + " | ".join(f"{c[d][0]:.2f}x {c[d][1]}/{c[d][2]}" if d in c else "-"
                                               for d in drafters) + " |")
        for d in drafters:
            xs = [c[d][0] for c in rows.values() if d in c]
            print(f"{name}: {d} worst {min(xs):.3f}x, mean {statistics.mean(xs):.3f}x, "
                  f"{sum(x < 0.97 for x in xs)} of {len(xs)} under 0.97x")


def stored_curve(name: str) -> list[float] | None:
    table = json.loads(Path(_costs.cost_store_path()).read_text())
    base = Path(model_path(name)).name
    for k, v in table.items():
        if k.startswith(_costs.STORE_VERSION + "|llama.cpp|") and base in k and "|tiled 0|" in k:
            return v
    return None


def gate_settings(**gate) -> GateSettings:
    """``GateSettings`` from JSON keywords (``priors`` by name: "table" or "flat")."""
    if "priors" in gate:
        gate["priors"] = Priors(gate["priors"])
    return GateSettings(**gate)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--models", default="smollm2,gemma")
    c.add_argument("--tokens", type=int, default=128)
    c.add_argument("--out", default="/tmp/gate-sim")
    s = sub.add_parser("simulate")
    s.add_argument("--models", default="smollm2,gemma")
    s.add_argument("--dir", default="/tmp/gate-sim")
    s.add_argument("--n-draft", type=int, default=16)
    s.add_argument("--drafters", default="copy,suffix")
    s.add_argument("--costs", help="JSON {model: [cost of 1, 2, ... tokens]} (default: the stored curves)")
    s.add_argument("--gate", default=None, help='JSON GateSettings for the gates, e.g. \'{"risk": null}\'')
    s.add_argument("--summary", action="store_true", help="only each drafter's worst cell, mean and cells under 0.97x")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    if args.cmd == "collect":
        collect(models, args.tokens, Path(args.out))
        return 0
    curves = json.loads(args.costs) if args.costs else {m: stored_curve(m) for m in models}
    drafters = args.drafters.split(",")
    settings = gate_settings(**(json.loads(args.gate) if args.gate else {}))
    print_table(simulate(models, Path(args.dir), curves, drafters, args.n_draft, settings), drafters, args.summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
