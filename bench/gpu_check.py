"""transformers on a CUDA GPU: what verifying k tokens costs, whether batched logits equal
one-token logits, and the end-to-end speed of drafting, for float32 and bfloat16.

    python bench/gpu_check.py --model SmolLM2.gguf --out results/          # on a CUDA machine
    python bench/gpu_check.py --config cfg/ --out results/                 # random weights
    python bench/gpu_check.py --device cpu --quick --out /tmp/check        # smoke test anywhere

bench/gpu_check.sh packs what a machine without network needs, builds ngramcache there and
runs this script; see its header. Where each forward pass costs about 40 ms (an H200 in a
virtual machine, bound by the host: see bench/RESULTS.md), float32 takes about 8 minutes and
bfloat16 as long: run one dtype per call (``--dtypes``) under a 10-minute limit. One model load (the GGUF file dequantised to float32 on the
CPU, ``ngramcache.integrations.hf.load_model``), then, per dtype, a copy moved to the device:

costs  seconds for a forward pass of k = 1..33 tokens after a 512-token context, relative to
       k = 1 (``ngramcache.integrations.hf_costs.calibrate``: what the adaptive draft length
       is chosen from; measured twice, here and inside the end-to-end run, as a check of its
       spread).
rows   hf_rows.py's two comparisons, per setting (as loaded, torch's deterministic
       algorithms, eager attention): logits of tokens fed 8 at a time against one at a time
       (rows bitwise equal, max |diff|, argmax flips), and plain greedy ``generate`` against
       drafted greedy generation (prompts whose outputs differ).
e2e    bench_hf.py's variants (plain, hf-pld-10, ngc, ngc-fixed10, oracle) on its workloads:
       tokens/s medians, speedups over plain, whether each output equals plain's.

``--config DIR`` (a saved transformers config and tokenizer) builds the same architecture with
random weights (seed 0) when the model file cannot be had: the costs and rows figures still
hold (they depend on the shapes and the arithmetic, not on the weights' values), but drafts
of a random model are not accepted as a trained one's, so e2e runs plain and oracle only.
Every stage's figures go to ``--out`` as JSON as soon as they are measured; a stage that
fails is recorded with its error and the others still run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from pathlib import Path

# ngramcache as installed (with its compiled core) before bench_hf and hf_rows put the source
# folder first on sys.path
import ngramcache  # noqa: F401
import torch
import transformers
from ngramcache import data, hf
from ngramcache.files import atomic_open

import bench_hf  # noqa: E402  (wraps transformers' candidate generators to count drafts)
import hf_rows  # noqa: E402

ROW_SETTINGS = ("default", "deterministic", "eager")
E2E_VARIANTS = ("plain", "hf-pld-10", "ngc", "ngc-fixed10", "oracle")
RANDOM_E2E_VARIANTS = ("plain", "oracle")
COST_KS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 33)


def log(msg: str) -> None:
    print(msg, flush=True)


def environment(device: str) -> dict:
    env = {"torch": torch.__version__, "transformers": transformers.__version__, "device": device,
           "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
           "threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        env.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                   tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                   bf16_reduced_precision_reduction=torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
                   cudnn_tf32=torch.backends.cudnn.allow_tf32)
    return env


def load(args) -> tuple:
    """(float32 model on the CPU, tokenizer, whether its weights are random)."""
    if args.model:
        model, tok = hf.load_model(args.model)
        return model, tok, False
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.from_pretrained(args.config, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(args.config, local_files_only=True)
    return model, tok, True


def tasks(path: str | None) -> list:
    """The end-to-end workloads: from a JSON list of {name, prompt, source} (so that a machine
    whose texts differ runs the same prompts), else ``ngramcache.data.bench_tasks()``."""
    if path is None:
        return data.bench_tasks()
    with open(path, encoding="utf-8") as f:
        return [data.Task(**t) for t in json.load(f)]


def relative_costs(costs) -> dict:
    return {k: costs[k - 1] / costs[0] for k in COST_KS if k <= len(costs)}


def stage_costs(model, quick: bool) -> dict:
    max_batch = 9 if quick else 33
    costs = hf.calibrate(model, max_batch=max_batch, n_context=64 if quick else 512)
    return {"seconds": costs, "relative": relative_costs(costs)}


def stage_rows(model, tok, quick: bool) -> dict:
    n_rows, n_tokens, n_flips, flip_tokens = (1, 12, 2, 8) if quick else (3, 48, 30, 24)
    row_ps = [p.to(model.device) for p in hf_rows.prompts(tok, n_rows)]
    flip_ps = [p.to(model.device) for p in hf_rows.prompts(tok, n_flips)]
    out = {"tokens": n_tokens, "chunk": 8, "flip_tokens": flip_tokens}
    for name in ROW_SETTINGS:
        t = time.perf_counter()
        try:
            with hf_rows.setting(model, name):
                r = {"rows": hf_rows.compare_rows(model, row_ps, n_tokens, 8),
                     "flips": hf_rows.compare_outputs(model, flip_ps, flip_tokens)}
        except Exception as e:  # e.g. an op without a deterministic kernel: recorded, not fatal
            r = {"error": f"{type(e).__name__}: {e}"}
        r["seconds"] = time.perf_counter() - t
        out[name] = r
        brief = {k: v for k, v in r.get("flips", {}).items() if k != "where"}
        log(f"  rows {name}: {r.get('rows', r.get('error'))}, outputs {brief}, {r['seconds']:.0f} s")
    return out


def stage_e2e(name: str, model, tok, workloads, variants, quick: bool) -> dict:
    n_tokens, repeats = (16, 1) if quick else (128, 3)
    return bench_hf.run_model(name, workloads, n_tokens, repeats, variants, log, loaded=(model, tok))


def run_stage(per: dict, key: str, fn, *a):
    """``per[key] = fn(*a)``, or the error it raised (the other stages still run)."""
    t = time.perf_counter()
    try:
        per[key] = fn(*a)
    except Exception as e:
        traceback.print_exc()
        per[key] = {"error": f"{type(e).__name__}: {e}"}
    log(f"[{key}] {time.perf_counter() - t:.0f} s")
    return per[key]


def summary(results: dict) -> str:
    """Markdown tables of the figures, for bench/RESULTS.md and docs/exactness.md."""
    lines = []
    dtypes = [d for d in ("float32", "bfloat16") if d in results["dtypes"]]
    lines.append("verify cost of k tokens after 512, relative to k = 1 (two calibrations: alone / in the e2e run)\n")
    lines.append("| dtype | k=1 ms | " + " | ".join(f"k={k}" for k in COST_KS[1:]) + " |")
    lines.append("|---|---:|" + "---:|" * (len(COST_KS) - 1))
    for d in dtypes:
        r = results["dtypes"][d]
        c, e = r.get("costs", {}), r.get("e2e", {})
        if "relative" not in c:
            lines.append(f"| {d} | {c.get('error', '-')} |")
            continue
        again = relative_costs(e["costs"]) if "costs" in e else {}
        c = {**c, "relative": {int(k): v for k, v in c["relative"].items()}}  # JSON keys are strings
        lines.append(f"| {d} | {1000 * c['seconds'][0]:.2f} | " + " | ".join(
            f"{c['relative'][k]:.2f} / {again[k]:.2f}" if k in again else f"{c['relative'][k]:.2f}"
            for k in COST_KS[1:] if k in c["relative"]) + " |")
    lines.append("\nbatched (8 at a time) against one-token logits, and plain against drafted greedy outputs\n")
    lines.append("| dtype | setting | rows bitwise equal | max abs diff | argmax flips | outputs differ | accepted/drafted |")
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    for d in dtypes:
        rows = results["dtypes"][d].get("rows", {})
        for s in ROW_SETTINGS:
            r = rows.get(s)
            if r is None or "error" in r:
                lines.append(f"| {d} | {s} | {(r or rows).get('error', '-')} | | | | |")
                continue
            rr, f = r["rows"], r["flips"]
            lines.append(f"| {d} | {s} | {rr['bitwise_equal']}/{rr['rows']} | {rr['max_abs_diff']:.3g} | "
                         f"{rr['argmax_flips']} | {f['differ']}/{f['prompts']} | {f['accepted']}/{f['drafted']} |")
    for d in dtypes:
        e = results["dtypes"][d].get("e2e", {})
        if "tasks" in e:
            variants = tuple(next(iter(e["tasks"].values()))["variants"])
            lines.append(bench_hf.markdown({f"{results['model_name']} on {results['env']['device']}": e},
                                           "gen_tok_s", variants))
            lines.append(bench_hf.markdown({f"{results['model_name']} on {results['env']['device']}": e},
                                           "e2e_tok_s", variants))
        elif "error" in e:
            lines.append(f"\ne2e {d}: {e['error']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="GGUF file or packaged model name")
    src.add_argument("--config", help="folder with a transformers config and tokenizer: random weights")
    ap.add_argument("--tasks", help="JSON list of {name, prompt, source} workloads (default: this machine's)")
    ap.add_argument("--device", default="cuda", help="torch device (default: cuda)")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma list (default: float32,bfloat16)")
    ap.add_argument("--stages", default="costs,rows,e2e", help="comma list of costs, rows, e2e")
    ap.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, to check that the script runs")
    args = ap.parse_args(argv)
    stages = set(args.stages.split(","))
    if stages - {"costs", "rows", "e2e"}:
        ap.error(f"unknown stages: {', '.join(sorted(stages - {'costs', 'rows', 'e2e'}))}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    for d in dtypes:
        if not isinstance(getattr(torch, d, None), torch.dtype):
            ap.error(f"--dtypes: {d!r} is not a torch dtype")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "gpu_check.json"

    t = time.perf_counter()
    base, tok, random_weights = load(args)
    workloads = tasks(args.tasks)
    if args.quick:
        workloads = workloads[1:2]
    results = {"env": environment(args.device), "model_name": Path(args.model or args.config).name,
               "random_weights": random_weights, "dtypes": {}}
    log(f"loaded in {time.perf_counter() - t:.0f} s: {json.dumps(results['env'])}")
    variants = RANDOM_E2E_VARIANTS if random_weights else E2E_VARIANTS
    for d in dtypes:
        model = copy.deepcopy(base).to(device=args.device, dtype=getattr(torch, d))
        with torch.no_grad():  # the first pass on a device loads kernels and libraries
            model(torch.tensor([[1, 2, 3]], device=model.device))
        per = results["dtypes"].setdefault(d, {})
        if "costs" in stages:
            r = run_stage(per, "costs", stage_costs, model, args.quick)
            log(f"  {d} costs: {r.get('relative', r)}")
            _save(results, json_path)
        if "rows" in stages:
            run_stage(per, "rows", stage_rows, model, tok, args.quick)
            _save(results, json_path)
        if "e2e" in stages:
            run_stage(per, "e2e", stage_e2e, results["model_name"], model, tok, workloads, variants,
                      args.quick)
            _save(results, json_path)
        del model
    try:
        text = summary(results)
    except Exception:  # the figures are in the JSON already
        traceback.print_exc()
        text = "(no summary: see gpu_check.json)"
    with atomic_open(out / "gpu_check.md", "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print("\n" + json.dumps(results["env"]) + "\n" + text)
    return 0


def _save(results: dict, path: Path) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
