"""Which quantization types are exact, and what exactness costs on each, against
llama-cpp-python's default build.

    .venv/bin/python bench/bench_quant_types.py --default-build DIR [--types Q4_K_M,Q8_0] [--rounds 2]
        [--extra model.gguf ...] [--json FNAME]
    .venv/bin/python bench/bench_quant_types.py --exactness-only [--types ...]

``--default-build`` is a folder holding llama-cpp-python as a user installs it (llamafile's
kernels, built for the machine): ``bench/build_default_llama.sh`` makes it.

The models: each type of ``--types`` is made from the packaged Gemma 3 270M with llama.cpp's
own quantize (``llama_model_quantize`` through llama-cpp-python, requantizing the packaged
weights: what is measured is the types' kernels, not their quality) into ``build/quant/``,
once; ``--extra`` adds GGUF files as they are.

For each model, every measurement in a fresh process (ggml reads its switches once per
process), configurations alternating within each round:

  default  the default build, llama-cpp-python's own loading (weights repacked, tiled K-quant
           matmul on, llamafile's kernels compiled in): a batch's rows differ from one token's
  exact    the README's build, ``make_llama(prompt_layout=False)``: no repacking, tiled matmul off
  layout   the README's build, ``make_llama()``: what ngramcache loads by default. Tokens and
           drafts as ``exact``; prompts through the default build in a worker process (the
           default build of ``--default-build`` stands for the user's own), or without one
           (``--exactness-only``) through a repacked copy of the weights where this CPU repacks
           at least half of the model's matrices

Each process measures: a 500-token prompt, one decoded token, verifying 4, 8 and 16 tokens (ms,
medians within the process), and end to end the shipped demo prompt (160 tokens, the tok/s
with the prompt included) plain and with ngramcache's default drafter. Once per model, on the
README build: whether it is exact (rows of batches of 2..17 tokens bitwise equal to one-token
rows, 34 rows each) and whether drafting changed a token on the demo prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "IQ4_XS")
CONFIGS = ("default", "exact", "layout")
KS = (4, 8, 16)
PROMPT_TOKENS = 500
DEMO_TOKENS = 160
ROWS = 34  # rows compared per batch size
CHUNKS = range(2, 18)


def quantized(kind: str, out_dir: Path) -> Path:
    """The packaged Gemma 3 270M requantized to ``kind`` (made once; atomic)."""
    import llama_cpp

    from ngramcache.models import default_model_path

    src = default_model_path("gemma")
    dst = out_dir / f"gemma3-270m-{kind}.gguf"
    if dst.is_file():
        return dst
    out_dir.mkdir(parents=True, exist_ok=True)
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}", None)
    if ftype is None:
        raise SystemExit(f"unknown quantization type {kind!r}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = 2
    tmp = dst.with_suffix(".gguf.tmp")
    print(f"quantizing {os.path.basename(src)} to {kind} ...", file=sys.stderr, flush=True)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize to {kind} failed (return code {rc})")
    os.replace(tmp, dst)
    return dst


def _child(path: str, config: str, repeats: int, check: bool, timing: bool = True) -> dict:
    import numpy as np

    from ngramcache import data
    from ngramcache import llama as nl

    llm = nl.make_llama(path, n_ctx=2048, n_batch=512, n_threads=2, exact=config != "default",
                        prompt_layout=config == "layout" and None)
    backend = nl.LlamaBackend.of(llm)
    text, _ = data.prose(6000)
    tokens = np.asarray(llm.tokenize(text.encode()), dtype=np.int32)
    prompt = np.resize(tokens, PROMPT_TOKENS).astype(np.int32)
    follow = np.resize(tokens[::-1], 32).astype(np.int32)
    layout = getattr(llm, "_ngramcache_prompt_layout", None)
    out: dict = {"layout_mib": round(layout.memory_bytes / 2**20, 1) if layout else 0.0}

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def prompt_pass():
        backend.clear()
        backend.decode(prompt, 0, PROMPT_TOKENS - 1)
        backend.logits(PROMPT_TOKENS - 1)

    if not timing:
        task = data.demo_task()
        plain = nl.generate(llm, task.prompt, None, 64)
        drafted = nl.generate(llm, task.prompt, nl.adaptive_drafter(llm, n_draft=16), 64)
        out["drafted_equal"] = drafted.tokens.tolist() == plain.tokens.tolist()
        out["rows"] = _rows_equal(backend, prompt[:200], follow)
        llm.close()
        return out
    prompt_pass()  # warm-up: first matrix products, page faults
    out["prompt_ms"] = statistics.median(timed(prompt_pass) for _ in range(3))

    def batch(k: int):
        backend.truncate(PROMPT_TOKENS)
        backend.decode(follow[:k], PROMPT_TOKENS, 0)
        backend.logits(k - 1)

    for k in (1,) + KS:
        batch(k)
        out[f"verify{k}_ms"] = statistics.median(timed(lambda: batch(k)) for _ in range(repeats * (2 if k == 1 else 1)))

    task = data.demo_task()
    drafter = nl.adaptive_drafter(llm, n_draft=16)
    nl.generate(llm, task.prompt, drafter, 8)  # warm
    plain = nl.generate(llm, task.prompt, None, DEMO_TOKENS)
    drafted = nl.generate(llm, task.prompt, drafter, DEMO_TOKENS)
    out["plain_e2e"] = plain.e2e_tokens_per_s
    out["ngc_e2e"] = drafted.e2e_tokens_per_s
    out["drafted_equal"] = drafted.tokens.tolist() == plain.tokens.tolist()
    if check:
        out["rows"] = _rows_equal(backend, prompt[:200], follow)
    llm.close()
    return out


def _rows_equal(backend, prompt, follow) -> dict:
    """Rows of batches of c tokens (c in CHUNKS) bitwise equal to the same tokens decoded one
    at a time after ``prompt``: {c: equal rows out of ROWS}."""
    import numpy as np

    n = len(prompt)
    tokens = np.resize(follow, ROWS).astype(np.int32)
    backend.clear()
    backend.decode(prompt, 0, n - 1)
    single = []
    for i in range(ROWS):
        backend.decode(tokens[i : i + 1], n + i, 0)
        single.append(backend.logits(0).copy())
    out = {}
    for c in CHUNKS:
        backend.truncate(n)
        equal = 0
        for s in range(0, ROWS, c):
            part = tokens[s : s + c]
            backend.decode(part, n + s, 0)
            equal += sum(np.array_equal(backend.logits(j).view(np.uint32), single[s + j].view(np.uint32))
                         for j in range(len(part)))
        out[c] = equal
    return out


def _run(path: Path, config: str, default_build: Path, repeats: int, check: bool, timing: bool = True) -> dict:
    env = dict(os.environ)
    env.pop("GGML_CPU_TILED_MM", None)
    env.pop("NGRAMCACHE_PROMPT_LAYOUT", None)
    env["NGRAMCACHE_CACHE_DIR"] = str(ROOT / "build" / "quant" / f"cache-{config}")  # each build its own costs
    # ngramcache as installed (the editable install maps the package to src/)
    paths = [env.get("PYTHONPATH", "")]
    if config == "default":
        paths.insert(0, str(default_build))
    # ngramcache's default loading finds the default build (if given) and sends prompts to it
    env["NGRAMCACHE_DEFAULT_BUILD"] = str(default_build) if default_build and config == "layout" else os.devnull
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    cmd = [sys.executable, __file__, "--child", str(path), "--config", config, "--repeats", str(repeats)]
    if check:
        cmd.append("--check")
    if not timing:
        cmd.append("--exactness-only")
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"{config} {path.name} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _types_of(path: Path) -> str:
    from collections import Counter

    from ngramcache.integrations.llama_prompt import gguf_tensor_types

    counts = Counter(t for name, (t, dims) in gguf_tensor_types(path).items() if len(dims) == 2)
    return " ".join(f"{t}:{n}" for t, n in counts.most_common())


def _med(xs) -> float:
    return statistics.median(xs)


def table(results: dict) -> list[str]:
    lines = [
        "| type | matrices | exact (rows equal, batches 2-17) | drafted == plain | prompt ms default / exact / "
        "layout | decode 1 ms default / exact | verify 4 / 8 / 16 ms default | verify 4 / 8 / 16 ms exact | "
        "layout memory | e2e tok/s: plain default (your llama-cpp-python) | ngc default | ngc exact (layout) | "
        "exact / default (ngc) | vs your llama-cpp-python |",
        "|---|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        by = r["runs"]
        d, e, lay = by["default"], by["exact"], by["layout"]
        rows = r["rows"]
        total = sum(rows.values())
        full = ROWS * len(rows)
        bad = [c for c, v in rows.items() if v != ROWS]
        exact = f"{total}/{full}" + (" yes" if not bad else f" no (batches {','.join(map(str, bad))})")
        eq = "yes" if all(f["drafted_equal"] for f in e + lay) else "NO"

        def m(runs, key):
            return _med([f[key] for f in runs])

        ratio = [a["ngc_e2e"] / b["ngc_e2e"] for a, b in zip(lay, d)]
        vs_user = [a["ngc_e2e"] / b["plain_e2e"] for a, b in zip(lay, d)]
        lines.append(
            f"| {name} | {r['types']} | {exact} | {eq} | {m(d, 'prompt_ms'):.0f} / {m(e, 'prompt_ms'):.0f} / "
            f"{m(lay, 'prompt_ms'):.0f} | {m(d, 'verify1_ms'):.1f} / {m(e, 'verify1_ms'):.1f} | "
            + " / ".join(f"{m(d, f'verify{k}_ms'):.0f}" for k in KS) + " | "
            + " / ".join(f"{m(e, f'verify{k}_ms'):.0f}" for k in KS) + " | "
            f"{m(lay, 'layout_mib'):.0f} MiB | {m(d, 'plain_e2e'):.1f} | {m(d, 'ngc_e2e'):.1f} | "
            f"{m(lay, 'ngc_e2e'):.1f} | {_med(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f}) | "
            f"{_med(vs_user):.2f}x |")
    return lines


def _exactness_only(args) -> int:
    out = {}
    print("| type | matrices | rows equal, batches 2-17 | drafted == plain (demo prompt, 64 tokens) |")
    print("|---|---|---|---|")
    for name, path in _models(args).items():
        fig = _run(path, "layout", args.default_build, args.repeats, True, timing=False)
        rows = {int(c): v for c, v in fig["rows"].items()}
        bad = [c for c, v in rows.items() if v != ROWS]
        out[name] = {"types": _types_of(path), "rows": rows, "drafted_equal": fig["drafted_equal"]}
        print(f"| {name} | {out[name]['types']} | {sum(rows.values())}/{ROWS * len(rows)} "
              + ("yes" if not bad else f"no (batches {','.join(map(str, bad))})")
              + f" | {'yes' if fig['drafted_equal'] else 'NO'} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def _models(args) -> dict:
    models = {k: quantized(k, ROOT / "build" / "quant") for k in args.types.split(",") if k}
    models.update({Path(p).name: Path(p) for p in args.extra})
    return models


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--default-build", type=Path, help="folder with the default build's llama_cpp package")
    ap.add_argument("--types", default=",".join(TYPES), help="comma list of llama.cpp quantization types")
    ap.add_argument("--extra", nargs="*", default=[], help="GGUF files measured as they are")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5, help="repeats of each batch within a process")
    ap.add_argument("--exactness-only", action="store_true",
                    help="only whether each type is exact (rows and drafted output), no timings: a busy machine "
                         "changes no answer of these")
    ap.add_argument("--json", metavar="FNAME")
    ap.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--config", choices=CONFIGS, help=argparse.SUPPRESS)
    ap.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.config, args.repeats, args.check, not args.exactness_only)))
        return 0
    if args.exactness_only:
        return _exactness_only(args)
    if args.default_build is None or not (args.default_build / "llama_cpp").is_dir():
        ap.error("--default-build must name a folder holding a llama_cpp package (bench/build_default_llama.sh)")
    models = _models(args)
    results: dict = {}
    for name, path in models.items():
        results[name] = {"types": _types_of(path), "runs": {c: [] for c in CONFIGS}}
        for r in range(args.rounds):
            order = CONFIGS if r % 2 == 0 else CONFIGS[::-1]
            for config in order:
                check = r == 0 and config == "exact"
                fig = _run(path, config, args.default_build, args.repeats, check)
                if check:
                    results[name]["rows"] = {int(c): v for c, v in fig.pop("rows").items()}
                results[name]["runs"][config].append(fig)
                print(f"{name} round {r + 1} {config:8s} " + " ".join(
                    f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in fig.items()),
                    file=sys.stderr, flush=True)
        if args.json:  # after every model: a long run interrupted keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=1))
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
