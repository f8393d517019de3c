"""The drafting gate, replayed against a model's real greedy outputs with a modelled clock.

On an exact build a drafted run emits the same tokens as plain decoding, so how a drafter and
its gate would do on a prompt is fixed by two things: the plain output (what verification
would confirm) and the model's verification cost curve (what a batch of k tokens costs). This
tool records the first once per model (``collect``: real plain runs through llama-cpp-python
on the benchmark workloads), then runs the real decoding loop, drafter and gate against a
backend that answers from that record and charges ``cost(k)`` for each batch (``simulate``).
The result is a speed-up over plain that does not drift with machine noise, for every workload
at once, in seconds; the timed benchmarks (bench_e2e.py, bench_chat.py) then confirm the
policies that look best. ``bench/make_gate_priors.py`` fits the gate's priors from the same
records.

    .venv/bin/python bench/gate_sim.py collect --models smollm2,gemma --tokens 128 --out /tmp/gate-sim
    .venv/bin/python bench/gate_sim.py simulate --dir /tmp/gate-sim --models smollm2,gemma

Modelled time per step: ``cost(k+1)`` for verifying k drafted tokens (cost(1) = one plain
step), plus the drafter's own measured time in units of one plain step (``--step-ms``). The
gate is told each verification's modelled time, with a log-normal spread (``--clock-noise``),
to learn its curve from. ``--stale F`` starts the gates from a curve whose extra cost over one
token is F times the true one (F < 1: a curve flatter than the machine), and compares the
gate that learns its curve with one that takes it as given.
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
from ngramcache.decoding.loop import generate  # noqa: E402

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


class ReplayBackend:
    """A backend that answers from a recorded greedy output and charges ``costs[k-1]`` per
    batch of k tokens (prompt batches are free: plain pays them too)."""

    def __init__(self, prompt: np.ndarray, output: np.ndarray, n_vocab: int, costs: list[float]):
        self.prompt, self.output = prompt, output
        self.n_vocab, self.n_ctx, self.n_batch = n_vocab, 1 << 20, 1 << 16
        self.costs = costs
        self.units = 0.0
        self.steps = 0
        self._rows: list[int] = []

    def tokenize(self, prompt):
        return np.asarray(prompt, dtype=np.int32)

    def clear(self):
        pass

    def truncate(self, pos):
        pass

    def is_eog(self, tok):
        return False

    def piece(self, tok):
        return b""

    def decode(self, tokens, pos0, logits_from):
        n = len(tokens)
        if pos0 >= self.prompt.size:  # a verification step
            self.units += self.costs[min(n, len(self.costs)) - 1]
            self.steps += 1
        self._rows = [pos0 + i + 1 - self.prompt.size for i in range(n)]

    def logits(self, i):
        row = np.zeros(self.n_vocab, dtype=np.float32)
        j = self._rows[i]
        if 0 <= j < self.output.size:
            row[self.output[j]] = 1.0
        return row


class ModelledClock:
    """A drafter whose verifications are reported with their modelled time (the true
    ``cost(k)`` of the batch, in plain steps, times a log-normal factor of spread ``noise``),
    not the replay's own microseconds."""

    def __init__(self, drafter, costs: list[float], noise: float, seed: int = 0, spikes: float = 0.0):
        self.inner, self.costs, self.noise, self.spikes = drafter, costs, noise, spikes
        self.rng = np.random.default_rng(seed)
        self.stats = drafter.stats

    def reset(self, prompt_tokens):
        self.inner.reset(prompt_tokens)

    def accept(self, tokens):
        self.inner.accept(tokens)

    def propose(self, n_max):
        return self.inner.propose(n_max)

    def verified(self, n_tokens, seconds):
        t = self.costs[min(n_tokens, len(self.costs)) - 1]
        if self.noise:
            t *= float(np.exp(self.rng.normal(0.0, self.noise)))
        if self.spikes and self.rng.random() < self.spikes:  # the process descheduled: ten times as long
            t *= 10.0
        self.inner.verified(n_tokens, t)


def _run(rec, n_vocab, costs, drafter, step_s, noise=0.0, spikes=0.0):
    prompt = np.asarray(rec["prompt"], dtype=np.int32)
    output = np.asarray(rec["output"], dtype=np.int32)
    be = ReplayBackend(prompt, output, n_vocab, costs)
    if callable(getattr(drafter, "verified", None)):
        drafter = ModelledClock(drafter, costs, noise, spikes=spikes)
    r = generate(be, prompt, drafter, int(output.size))
    assert r.tokens.tolist() == output.tolist()
    plain_units = output.size - 1
    units = be.units + (r.t_draft / step_s if step_s else 0.0)
    return plain_units / units if units else float("nan"), r


def oracle_k(costs: list[float], n_max: int) -> int:
    return max(range(1, n_max + 1), key=lambda k: (k + 1) / costs[min(k, len(costs) - 1)])


def simulate(models: list[str], in_dir: Path, costs_by_model: dict, variants: dict, n_draft: int,
             step_ms: dict, stale: float = 1.0, noise: float = 0.0, spikes: float = 0.0) -> dict:
    from ngramcache.drafters.oracle import OracleDrafter

    table = {}
    for name in models:
        data = json.loads((in_dir / f"{name}.json").read_text())
        curve = costs_by_model[name]
        costs = _costs.extend_costs([c / curve[0] for c in curve], n_draft + 1)
        step_s = step_ms.get(name, 0.0) / 1e3
        k_or = oracle_k(costs, n_draft)
        rows = {}
        for rec in data["records"]:
            out = np.asarray(rec["output"], dtype=np.int32)
            o, _ = _run(rec, data["n_vocab"], costs, OracleDrafter(out, n_draft=k_or), 0.0)
            cells = {"oracle": o}
            for vname, make in variants.items():
                if make is None:  # any copy from the text seen, planned knowing the answer
                    cells[vname], drafted = any_copy_ceiling(rec["prompt"], out, costs, n_draft)
                    cells[vname + ":acc"] = (drafted, drafted)
                    continue
                drafter = make([1.0 + stale * (c - 1.0) for c in costs])  # the curve the gate is given
                if vname.endswith("ceiling"):  # cut by a gate that knows the answer
                    drafter = ClairvoyantGate(drafter, out, len(rec["prompt"]), costs)
                s, r = _run(rec, data["n_vocab"], costs, drafter, step_s, noise, spikes)
                cells[vname] = s
                cells[vname + ":acc"] = (r.accepted, r.drafted)
            rows[rec["workload"]] = cells
        table[name] = rows
    return table


class ClairvoyantGate:
    """A drafter whose proposals are cut to exactly their right prefix, and dropped when that
    prefix does not pay for its verification: the ceiling of a drafter under any gate."""

    def __init__(self, drafter, truth: np.ndarray, n_prompt: int, costs: list[float]):
        self.inner, self.truth, self.n_prompt, self.costs = drafter, truth, n_prompt, costs
        self.stats = drafter.stats

    def reset(self, prompt_tokens):
        self.inner.reset(prompt_tokens)
        self.n = len(prompt_tokens)

    def accept(self, tokens):
        self.inner.accept(tokens)
        self.n += len(tokens)

    def propose(self, n_max):
        cand = np.asarray(self.inner.propose(n_max), dtype=np.int32)
        at = self.n - self.n_prompt  # index in the output of the token after the sequence
        right = 0
        while right < cand.size and at + right < self.truth.size and cand[right] == self.truth[at + right]:
            right += 1
        if right == 0 or (right + 1) / self.costs[min(right, len(self.costs) - 1)] <= 1.0:
            return cand[:0]
        return cand[:right]


def copyable_lengths(prompt, truth, n_draft: int) -> list[int]:
    """For each i, the longest prefix of ``truth[i:]`` (at most ``n_draft`` tokens) that stands
    anywhere in ``prompt`` + ``truth[:i]``: what a drafter copying from the text seen could
    propose, and be right, before output token i."""
    seen = [int(t) for t in prompt] + [int(t) for t in truth]
    out = []
    for i in range(len(truth)):
        text = np.asarray(seen[: len(prompt) + i], dtype=np.int32).tobytes()
        n = 0
        while n < min(n_draft, len(truth) - i) and _occurs(text, np.asarray(truth[i: i + n + 1], np.int32).tobytes()):
            n += 1
        out.append(n)
    return out


def any_copy_ceiling(prompt, truth, costs: list[float], n_draft: int) -> tuple[float, int]:
    """The best any drafter copying from the text it has seen can do on this output: the
    plan of draft lengths (each at most the copyable prefix) that takes the least modelled
    time, found exactly (dynamic programming over output positions; no drafting time
    charged). Returns the speed-up over plain and the tokens drafted (all of them right).
    Where this falls short of the oracle, the model writes tokens the text does not hold."""
    n = len(truth)
    can = copyable_lengths(prompt, truth, n_draft)
    best, plan = [0.0] * (n + 1), [0] * (n + 1)
    # token 0 comes with the prompt pass; each step verifies k drafted tokens and gives k + 1
    for i in range(n - 1, 0, -1):
        best[i], plan[i] = min((costs[min(k, len(costs) - 1)] + best[min(n, i + k + 1)], k)
                               for k in range(min(can[i], n - i - 1) + 1))
    drafted, i = 0, 1
    while i < n:
        drafted += plan[i]
        i += plan[i] + 1
    return ((n - 1) / best[1] if n > 1 else 1.0), drafted


def _occurs(text: bytes, pattern: bytes) -> bool:
    """Whether ``pattern`` stands in ``text`` at a whole token (4-byte) boundary."""
    i = text.find(pattern)
    while i >= 0 and i % 4:
        i = text.find(pattern, i + 1)
    return i >= 0


def gate_settings(**gate):
    """``GateSettings`` from JSON keywords (``priors`` by name: "table" or "flat")."""
    from ngramcache.decoding.gate import GateSettings, Priors

    if "priors" in gate:
        gate["priors"] = Priors(gate["priors"])
    return GateSettings(**gate)


def _gated(n_draft: int, drafter: str, **gate):
    from ngramcache.decoding.gate import gated_drafter

    return lambda costs: gated_drafter(costs, drafter, n_draft, settings=gate_settings(**gate))


def _default_variants(n_draft: int, gate: dict | None = None) -> dict:
    from ngramcache.drafters.catalog import make_drafter

    gated = lambda drafter: _gated(n_draft, drafter, **(gate or {}))  # noqa: E731
    return {"copy": gated("copy"), "suffix": gated("suffix"),
            "copy ceiling": lambda costs: make_drafter("copy", n_draft=n_draft),
            "any-copy ceiling": None}


def print_summary(table: dict, variant: str = "copy") -> None:
    """One line per model: the worst cell, the mean and the cells under 0.97x plain."""
    for name, rows in table.items():
        xs = [c[variant] for c in rows.values() if c[variant] > 0]  # a record of one token has no steps
        print(f"{name}: {variant} worst {min(xs):.3f}x, mean {statistics.mean(xs):.3f}x, "
              f"{sum(x < 0.97 for x in xs)} of {len(xs)} under 0.97x")


def print_table(table: dict, variants) -> None:
    for name, rows in table.items():
        print(f"\n### {name}: modelled speed-up over plain (share of the oracle), accepted/drafted\n")
        print("| workload | oracle | " + " | ".join(variants) + " |")
        print("|---|---:|" + "---:|" * len(variants))
        for w, c in rows.items():
            cells = [f"{c[v]:.2f}x ({100 * c[v] / c['oracle']:.0f}%) {c[v + ':acc'][0]}/{c[v + ':acc'][1]}"
                     for v in variants]
            print(f"| {w} | {c['oracle']:.2f}x | " + " | ".join(cells) + " |")
        for v in variants:
            xs = [c[v] for c in rows.values()]
            print(f"{v}: min {min(xs):.3f}x, median {statistics.median(xs):.3f}x")


def stored_curve(name: str) -> list[float] | None:
    table = json.loads(Path(_costs.cost_store_path()).read_text())
    base = Path(model_path(name)).name
    for k, v in table.items():
        if k.startswith(_costs.STORE_VERSION + "|llama.cpp|") and base in k and "|tiled 0|" in k:
            return v
    return None


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
    s.add_argument("--costs", help="JSON {model: [cost of 1, 2, ... tokens]} (default: the stored curves)")
    s.add_argument("--step-ms", default="smollm2=9,gemma=14",
                   help="one plain step's time per model, to charge the drafter's own time")
    s.add_argument("--clock-noise", type=float, default=0.2,
                   help="log-normal spread of the verification times the gates are told")
    s.add_argument("--clock-spikes", type=float, default=0.0,
                   help="share of the verification times the gates are told ten times too long")
    s.add_argument("--gate", default=None,
                   help='JSON GateSettings for the gates of the gated variants, e.g. \'{"risk": null}\'')
    s.add_argument("--summary", action="store_true",
                   help="only the worst cell, the mean and the cells under 0.97x of the default drafter")
    s.add_argument("--stale", type=float, default=None,
                   help="start the gates from a curve whose extra cost is this times the true one, and "
                        "compare the gate that learns its curve with one that takes it as given")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    if args.cmd == "collect":
        collect(models, args.tokens, Path(args.out))
        return 0
    curves = json.loads(args.costs) if args.costs else {m: stored_curve(m) for m in models}
    step_ms = {k: float(v) for k, v in (kv.split("=") for kv in args.step_ms.split(","))}
    gate = json.loads(args.gate) if args.gate else {}
    variants = _default_variants(args.n_draft, gate)
    if args.summary:
        variants = {"copy": variants["copy"]}
    if args.stale is not None:
        variants = {k: variants[k] for k in ("copy", "copy ceiling")}
        variants["copy, curve as given"] = _gated(args.n_draft, "copy", **{**gate, "learn_costs": False})
    table = simulate(models, Path(args.dir), curves, variants, args.n_draft, step_ms,
                     1.0 if args.stale is None else args.stale, args.clock_noise, args.clock_spikes)
    if args.summary:
        print_summary(table)
    else:
        print_table(table, list(variants))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
