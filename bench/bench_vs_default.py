"""ngramcache against what a user had before installing it: llama-cpp-python's default build.

    .venv/bin/python bench/bench_vs_default.py --default-build DIR [--models gemma] [--rounds 3]
        [--tokens 128] [--json FNAME]

``--default-build`` is a folder holding llama-cpp-python as pip builds it by default
(``bench/build_default_llama.sh`` makes it). Four variants, on the shipped demo prompt and the
five workloads of bench_e2e.py:

  yours        plain decoding on the default build, loaded as llama-cpp-python loads models
               (weights repacked, tiled matmul on, llamafile's kernels): the user's baseline
  ngc-default  ngramcache's default drafter on the default build (``NGRAMCACHE_EXACT=0``): fast,
               but a batch's rows differ from one token's, so output can leave plain decoding's
  plain        plain decoding on the README's exact build, as ngramcache loads models (with the
               default build found, prompts go through it in a worker process: docs/exactness.md)
  ngc          ngramcache's default drafter on the exact build: what ngramcache gives by default
  plain-1, ngc-1  the same with every pass on the exact build (``NGRAMCACHE_PROMPT_LAYOUT=0``):
               what ngramcache gives where no default build is installed

Each build runs in its own process (one ``llama_cpp`` per process), a fresh one per round, the
builds' order alternating between rounds; within a process the variants alternate too. Printed:
tok/s end to end (prompt included; the medians of the rounds), and per workload the ratios
``ngc / ngc-default`` (what exactness costs), ``ngc / yours`` (what a user gains by installing
ngramcache) and ``ngc / plain`` (the same-build speedup), each with its range over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILDS = ("default", "exact", "one-build")
VARIANTS = {"default": ("yours", "ngc-default"), "exact": ("plain", "ngc"), "one-build": ("plain-1", "ngc-1")}


def e2e_child(path: str, build: str, tasks: list[tuple[str, str]], n_tokens: int) -> dict:
    """In this process (whose ``llama_cpp`` is the build measured): for each ``(name, prompt)``,
    plain decoding and ngramcache's default drafter, in turn; ``{name: {variant: figures}}``."""
    from ngramcache import llama as nl

    llm = nl.make_llama(path, n_ctx=4096, exact=build != "default")
    drafter = nl.adaptive_drafter(llm)
    nl.generate(llm, tasks[0][1][:400], drafter, 8)  # first touches of the weights are page faults
    plain_name, ngc_name = VARIANTS[build]
    out: dict = {}
    for i, (name, prompt) in enumerate(tasks):
        order = (plain_name, ngc_name) if i % 2 == 0 else (ngc_name, plain_name)
        for variant in order:
            r = nl.generate(llm, prompt, drafter if variant == ngc_name else None, n_tokens)
            out.setdefault(name, {})[variant] = {
                "e2e_tok_s": r.e2e_tokens_per_s, "gen_tok_s": r.gen_tokens_per_s, "t_prompt": r.t_prompt,
                "drafted": r.drafted, "accepted": r.accepted, "tokens": r.tokens.tolist()}
    layout = getattr(llm, "_ngramcache_prompt_layout", None)
    out["_layout_mib"] = round(layout.memory_bytes / 2**20, 1) if layout else 0.0
    llm.close()
    return out


def child_env(build: str, default_build: Path) -> dict:
    """The environment of a child process measuring ``build``: the default build first on
    PYTHONPATH and llama-cpp-python's own loading for ``default``; ngramcache's defaults
    (exact kernels, prompt layout) for ``exact``."""
    env = dict(os.environ)
    for k in ("GGML_CPU_TILED_MM", "NGRAMCACHE_EXACT", "NGRAMCACHE_PROMPT_LAYOUT"):
        env.pop(k, None)
    if build == "default":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(default_build), env.get("PYTHONPATH", "")) if p)
        env["NGRAMCACHE_EXACT"] = "0"
    elif build == "exact":
        env["NGRAMCACHE_DEFAULT_BUILD"] = str(default_build)
    else:
        env["NGRAMCACHE_PROMPT_LAYOUT"] = "0"
    return env


def _tasks() -> list[tuple[str, str]]:
    from ngramcache import data

    return [("demo", data.demo_task().prompt)] + [(t.name, t.prompt) for t in data.bench_tasks()]


def _run(model: str, build: str, default_build: Path, n_tokens: int, workloads: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", model, "--build", build, "--tokens", str(n_tokens),
           "--workloads", ",".join(workloads)]
    res = subprocess.run(cmd, env=child_env(build, default_build), capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"{build} {model} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _ratio(runs: list[dict], task: str, a: str, b: str) -> tuple[float, float, float]:
    xs = [r[task][a]["e2e_tok_s"] / r[task][b]["e2e_tok_s"] for r in runs]
    return statistics.median(xs), min(xs), max(xs)


def table(model: str, by_build: dict, workloads: list[str]) -> list[str]:
    lines = [f"{model}: tok/s end to end, medians of {len(by_build['exact'])} rounds",
             "",
             "| workload | yours | ngc-default | plain | ngc | ngc-1 | ngc / ngc-default | ngc / yours | "
             "ngc / plain | ngc-1 / yours | ngc == plain |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    # rounds paired by index: the processes of one round ran back to back
    rounds = [{t: {**d[t], **e[t], **o[t]} for t in workloads}
              for d, e, o in zip(by_build["default"], by_build["exact"], by_build["one-build"])]
    for t in workloads:
        shown = ("yours", "ngc-default", "plain", "ngc", "ngc-1")
        med = {v: statistics.median(r[t][v]["e2e_tok_s"] for r in rounds) for v in shown}
        cells = [f"{med[v]:.1f}" for v in shown]
        for a, b in (("ngc", "ngc-default"), ("ngc", "yours"), ("ngc", "plain"), ("ngc-1", "yours")):
            m, lo, hi = _ratio(rounds, t, a, b)
            cells.append(f"{m:.2f} ({lo:.2f}-{hi:.2f})")
        equal = all(r[t]["ngc"]["tokens"] == r[t]["plain"]["tokens"]
                    and r[t]["ngc-1"]["tokens"] == r[t]["plain-1"]["tokens"] for r in rounds)
        lines.append(f"| {t} | " + " | ".join(cells) + f" | {'yes' if equal else 'NO'} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--default-build", type=Path, help="folder with the default build's llama_cpp package")
    ap.add_argument("--models", default="gemma", help="comma list of packaged model names or GGUF paths")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--workloads", default="all", help="comma list of demo and bench_e2e's workloads, or all")
    ap.add_argument("--json", metavar="FNAME")
    ap.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--build", choices=BUILDS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    tasks = _tasks()
    names = [n for n, _ in tasks] if args.workloads == "all" else args.workloads.split(",")
    unknown = set(names) - {n for n, _ in tasks}
    if unknown:
        ap.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    if args.child:
        from ngramcache.models import model_path

        chosen = [(n, p) for n, p in tasks if n in names]
        print(json.dumps(e2e_child(model_path(args.child), args.build, chosen, args.tokens)))
        return 0
    if args.default_build is None or not (args.default_build / "llama_cpp").is_dir():
        ap.error("--default-build must name a folder holding a llama_cpp package (bench/build_default_llama.sh)")
    results: dict = {}
    for model in args.models.split(","):
        by_build: dict = {b: [] for b in BUILDS}
        for r in range(args.rounds):
            for build in (BUILDS if r % 2 == 0 else BUILDS[::-1]):  # the order alternates
                fig = _run(model, build, args.default_build, args.tokens, names)
                by_build[build].append(fig)
                print(f"{model} round {r + 1} {build}: " + ", ".join(
                    f"{t} " + "/".join(f"{fig[t][v]['e2e_tok_s']:.1f}" for v in VARIANTS[build]) for t in names),
                    file=sys.stderr, flush=True)
        results[model] = by_build
        print("\n".join(table(model, by_build, names)) + "\n", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
