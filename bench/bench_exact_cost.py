"""What exact verification costs: llama.cpp's default CPU kernels against the exact ones.

    .venv/bin/python bench/bench_exact_cost.py --default-build build/llama-default [--rounds 3]

Two builds of llama-cpp-python, three configurations, the same model files, one machine, alternating:

  default     llama-cpp-python built without -DGGML_LLAMAFILE=OFF (llamafile's sgemm on), models
              loaded as llama-cpp-python loads them (weights repacked for the CPU), the tiled
              K-quant matmul on: batched logits differ from one-token logits
  exact       the build the README installs (-DGGML_LLAMAFILE=OFF), models loaded without weight
              repacking, GGML_CPU_TILED_MM=0, the weight products in ngramcache's exact kernels
              (ngramcache.integrations.llama_exact_matmul): batched logits equal one-token
              logits bit for bit
  exact-ggml  the same with the weight products left to ggml's own one-token kernel
              (NGRAMCACHE_EXACT_MATMUL=0): also bit for bit, what the exact build cost before

``--default-build`` is a folder holding the default build's ``llama_cpp`` package, e.g. made by

    CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF" pip install --no-cache-dir --no-deps \\
        --target build/llama-default llama-cpp-python==0.3.36

Each measurement runs in a fresh process (the kernel switches are read once per process) and
prints the milliseconds of: processing a 500-token prompt, decoding one token, and verifying a
batch of k = 2, 4, 8, 16 drafted tokens (logits for every row, as the speculative loop asks).
Within a process each figure is the median of several repeats; across processes the table shows
the median of the rounds and the spread (min-max). Ratios compare the builds of one round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KS = (2, 4, 8, 16)
PROMPT_TOKENS = 500


def _child(model: str, exact: bool, repeats: int) -> dict:
    import numpy as np

    from ngramcache import data
    from ngramcache import llama as nl
    from ngramcache.models import model_path

    import llama_cpp

    from ngramcache.integrations.exactness import no_weight_repacking

    if exact:
        from ngramcache.integrations import llama_exact_matmul

        llama_exact_matmul.install(2)  # off where NGRAMCACHE_EXACT_MATMUL=0 (exact-ggml)
    with no_weight_repacking() if exact else contextlib.nullcontext():
        llm = llama_cpp.Llama(model_path(model), n_ctx=2048, n_batch=512, n_threads=2, n_threads_batch=2,
                              verbose=False)
    backend = nl.LlamaBackend.of(llm)
    text, _ = data.prose(6000)  # real text: its tokens, not a repeated one, fill the prompt
    tokens = np.asarray(llm.tokenize(text.encode()), dtype=np.int32)
    prompt = np.resize(tokens, PROMPT_TOKENS).astype(np.int32)
    follow = np.resize(tokens[::-1], 32).astype(np.int32)

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def prompt_pass():
        backend.clear()
        backend.decode(prompt, 0, PROMPT_TOKENS - 1)
        backend.logits(PROMPT_TOKENS - 1)

    prompt_pass()  # warm-up: first matrix products, page faults
    out = {"prompt_ms": statistics.median(timed(prompt_pass) for _ in range(3))}

    def batch(k: int):
        backend.truncate(PROMPT_TOKENS)
        backend.decode(follow[:k], PROMPT_TOKENS, 0)
        backend.logits(k - 1)

    prompt_pass()
    batch(1)
    out["decode_ms"] = statistics.median(timed(lambda: batch(1)) for _ in range(repeats * 2))
    for k in KS:
        batch(k)
        out[f"verify{k}_ms"] = statistics.median(timed(lambda: batch(k)) for _ in range(repeats))
    out["llama_cpp"] = str(Path(llama_cpp.__file__).parent)
    return out


def _run(model: str, build: str, default_build: Path, repeats: int) -> dict:
    env = dict(os.environ)
    env.pop("GGML_CPU_TILED_MM", None)
    env["NGRAMCACHE_EXACT_MATMUL"] = "0" if build == "exact-ggml" else "1"
    if build == "default":
        env["PYTHONPATH"] = os.pathsep.join([str(default_build), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    else:
        env["GGML_CPU_TILED_MM"] = "0"
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, __file__, "--child", model, "--no-exact" if build == "default" else "--exact",
           "--repeats", str(repeats)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"{build} {model} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--default-build", type=Path, help="folder with the default build's llama_cpp package")
    ap.add_argument("--models", default="smollm2,gemma")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="repeats of each batch within a process")
    ap.add_argument("--json", metavar="FNAME")
    ap.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.exact, args.repeats)))
        return 0
    if args.default_build is None or not (args.default_build / "llama_cpp").is_dir():
        ap.error("--default-build must name a folder holding a llama_cpp package")
    results: dict = {}
    unit = "ms"
    builds = ("default", "exact", "exact-ggml")
    for r in range(args.rounds):
        for model in args.models.split(","):
            order = builds[r % 3:] + builds[:r % 3]  # each build first in turn
            for build in order:
                fig = _run(model, build, args.default_build, args.repeats)
                results.setdefault(model, {}).setdefault(build, []).append(fig)
                print(f"round {r + 1} {model:8s} {build:10s} "
                      + " ".join(f"{k[:-3]}={v:.1f}" for k, v in fig.items() if k.endswith("_ms")), flush=True)
    print()
    keys = ["prompt_ms", "decode_ms"] + [f"verify{k}_ms" for k in KS]
    print(f"| model | measure | default {unit} | exact {unit} | exact-ggml {unit} | exact / default | "
          "exact-ggml / default |")
    print("|---|---|---:|---:|---:|---:|---:|")

    def ratio(by, build, key):
        rs = [b[key] / a[key] for a, b in zip(by["default"], by[build])]
        return f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"

    for model, by in results.items():
        for key in keys:
            label = {"prompt_ms": f"prompt ({PROMPT_TOKENS} tokens)", "decode_ms": "decode 1 token"}.get(
                key, f"verify {key[6:-3]} tokens")
            med = [statistics.median(f[key] for f in by[b]) for b in builds]
            print(f"| {model} | {label} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | "
                  f"{ratio(by, 'exact', key)} | {ratio(by, 'exact-ggml', key)} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
