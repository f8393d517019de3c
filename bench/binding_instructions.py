"""Instructions per call of the compiled core's hot calls, binding included, for comparing
builds of ``_core`` on a busy machine (instruction counts do not depend on the load; times do).

    cc -O2 -shared -fPIC cpp/bench/callgrind_marks.c -o /tmp/callgrind_marks.so
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.NAME \\
        python bench/binding_instructions.py run \\
        path/to/_core.cpython-*.so /tmp/callgrind_marks.so
    python bench/binding_instructions.py table before=/tmp/cg.before after=/tmp/cg.after

``run`` loads ``_core`` from the given file (not the installed package, so that two builds
can be compared side by side), builds its inputs from a seeded token stream with repeats,
and runs each loop between two callgrind marks, which zero the counts before it and dump
them under its name after it. A count is what the loop's calls cost, in the binding and the core
and in the interpreter's work around each call (the same bytecode for every build), without
the start and the setup. ``table`` reads the dumps and prints instructions per call and their
ratios to the first build.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import re
import sys

import numpy as np

# (loop, calls): draft on a 20k-token context cache, without and with a static table; an
# update with one new token; a replay of 10k tokens; a copy and a prompt-lookup step
# (propose(8), then accept one token).
LOOPS = [("draft", 2000), ("draft+static", 2000), ("update", 5000), ("replay", 2),
         ("copy step", 2000), ("prompt-lookup step", 2000)]


def token_stream(n: int) -> np.ndarray:
    """Phrases of a 2,000-token vocabulary, a third of them repeats of earlier text."""
    rng = np.random.default_rng(7)
    out: list[int] = []
    while len(out) < n:
        if len(out) > 500 and rng.random() < 1 / 3:
            start = int(rng.integers(0, len(out) - 64))
            out += out[start : start + int(rng.integers(8, 64))]
        else:
            out += rng.integers(0, 2000, 16).tolist()
    return np.array(out[:n], dtype=np.int32)


def run(core_path: str, marks_path: str) -> None:
    spec = importlib.util.spec_from_file_location("_core", core_path)
    core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core)
    marks = ctypes.CDLL(marks_path)
    tokens = token_stream(40_000)
    ctx = core.NgramCache()
    ctx.update(tokens[:20_000], 1, 4, 20_000)
    table = core.StaticTable.build(tokens, 2)
    tok4 = tokens[5_000:5_004].copy()
    views = [tokens[: 8 + i] for i in range(5000)]
    growing = core.NgramCache()

    def steps(drafter, n):
        drafter.reset(tokens[:2_000])
        for i in range(2_000, 2_000 + n):
            drafter.propose(8)
            drafter.accept(tokens[i : i + 1])

    loops = {
        "draft": lambda n: [core.draft(tok4, 8, ctx, None, None, 1, 4) for _ in range(n)],
        "draft+static": lambda n: [core.draft(tok4, 8, ctx, None, table, 1, 4) for _ in range(n)],
        "update": lambda n: [growing.update(v, 1, 4, 1) for v in views[:n]],
        "replay": lambda n: [core.replay(tokens[:10_000], 512, 8, table, None, False, None) for _ in range(n)],
        "copy step": lambda n: steps(core.CopyDrafter(None, None, None), n),
        "prompt-lookup step": lambda n: steps(core.PromptLookupDrafter(), n),
    }
    for name, n in LOOPS:
        marks.marks_zero()
        loops[name](n)
        marks.marks_dump(name.encode())


def dumps(prefix: str) -> dict[str, int]:
    """{loop: instructions} from the callgrind files OUT.1, OUT.2, ... of one run."""
    out = {}
    for path in glob.glob(prefix + ".*"):
        text = open(path, encoding="utf-8", errors="replace").read()
        trigger = re.search(r"^desc: Trigger: Client Request: (.+)$", text, re.M)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        if trigger and total:
            out[trigger.group(1)] = int(total.group(1))
    return out


def table(builds: list[str]) -> None:
    counts = {}
    for b in builds:
        name, _, prefix = b.partition("=")
        counts[name] = dumps(prefix)
    names = list(counts)
    print("| loop | " + " | ".join(f"{n} (instr./call)" for n in names) + " | " +
          " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(names) - 1))
    for loop, calls in LOOPS:
        per = [counts[n][loop] / calls for n in names]
        print(f"| {loop} | " + " | ".join(f"{p:,.0f}" for p in per) + " | " +
              " | ".join(f"{p / per[0]:.3f}" for p in per[1:]) + " |")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "run" and len(sys.argv) == 4:
        run(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 4 and sys.argv[1] == "table":
        table(sys.argv[2:])
    else:
        raise SystemExit(__doc__)
