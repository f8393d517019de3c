#!/usr/bin/env python3
"""Batched against single-token logits, per kernel switch: the figures of docs/exactness.md.

    .venv/bin/python scripts/exact_rows.py                    # both packaged models, every setting
    .venv/bin/python scripts/exact_rows.py -m gemma --nodes   # also the first graph node that differs
    .venv/bin/python scripts/exact_rows.py --json             # one JSON object a line

For each model and setting, a fresh process (ggml reads its switches once per process)
greedily decodes 48 tokens one at a time after the shipped ~600-token check prompt, decodes
the same tokens again in batches of 8 after the same prompt, and compares the logits rows
(``ngramcache.integrations.exactness.measure_exactness``): rows bitwise equal, the largest
difference of one logit, the first row whose top token differs.

``--nodes`` also records every node of llama.cpp's compute graph through its eval callback
(``cb_eval``) while 8 tokens are decoded one at a time and then as one batch, and names the
first node (in graph order) whose rows differ, with its operation: where the batch-dependent
path sits. The raw attention scores (``kq-N``) are compared over the KV cells a row attends
to (its masked cells read cells that a single-token decode has not written yet). Skipped (and
counted): nodes that are not float32 and nodes whose shapes do not line up.

The settings:

  default       llama-cpp-python's own loading: weights repacked, tiled matmul on
  no-repack     weights as stored (use_extra_bufts = false), tiled matmul on
  no-tiled      weights repacked, GGML_CPU_TILED_MM=0
  exact         no repacking and GGML_CPU_TILED_MM=0: what ngramcache loads
  exact+nofuse  exact, and GGML_CPU_DISABLE_FUSION=1 (ggml's fused operations off)
  exact+fa      exact, and flash attention on

The llamafile kernels are a build option: the build under test says whether they are in.
``--build DIR`` runs another build of llama-cpp-python, installed in DIR, e.g. one with them:

    CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF" pip install --no-cache-dir --no-deps \\
        --target build/llama-readme llama-cpp-python==0.3.36
    .venv/bin/python scripts/exact_rows.py --build build/llama-readme
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys

SETTINGS = {
    # name: (environment, make_llama keywords)
    "default": ({"GGML_CPU_TILED_MM": "1"}, {"exact": False}),
    "no-repack": ({"GGML_CPU_TILED_MM": "1"}, {}),
    "no-tiled": ({"GGML_CPU_TILED_MM": "0"}, {"exact": False}),
    "exact": ({"GGML_CPU_TILED_MM": "0"}, {}),
    "exact+nofuse": ({"GGML_CPU_TILED_MM": "0", "GGML_CPU_DISABLE_FUSION": "1"}, {}),
    "exact+fa": ({"GGML_CPU_TILED_MM": "0"}, {"flash_attn": True}),
}


class GgmlTensor(ctypes.Structure):
    """The head of ggml's ``struct ggml_tensor`` (ggml.h, GGML_MAX_DIMS 4, 64 bytes of op
    parameters, 10 sources, 64-byte names)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


class NodeRecorder:
    """llama.cpp's eval callback: keeps (name, op, float32 array) of every node while on."""

    def __init__(self):
        import llama_cpp

        lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
        base = next(os.path.join(lib, n) for n in sorted(os.listdir(lib)) if n.startswith("libggml-base"))
        self.ggml = ctypes.CDLL(base)
        self.ggml.ggml_op_desc.restype = ctypes.c_char_p
        self.ggml.ggml_op_desc.argtypes = [ctypes.c_void_p]
        self.on = False
        self.nodes: list[tuple[str, str, object]] = []
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._call)

    def _call(self, t, ask, user_data):
        if ask or not self.on:
            return True  # ask: yes, every node's result is wanted
        import numpy as np

        ten = GgmlTensor.from_address(t)
        if ten.type != 0 or not ten.data:  # GGML_TYPE_F32 only
            return True
        ne, nb = list(ten.ne), list(ten.nb)
        span = sum((n - 1) * s for n, s in zip(ne, nb)) + 4
        buf = (ctypes.c_char * span).from_address(ten.data)
        arr = np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=np.float32), shape=ne[::-1],
                                              strides=nb[::-1]).copy()
        self.nodes.append((ten.name.decode(errors="replace"), self.ggml.ggml_op_desc(t).decode(), arr))
        return True


def first_differing_node(singles: list[list], batch: list, n: int, n_past: int) -> dict:
    """Compare the node lists of ``n`` single-token decodes with one batch of ``n``, all
    after ``n_past`` positions in a KV cache whose cell i holds position i."""
    import numpy as np

    skipped = compared = 0
    for k, (name, op, b) in enumerate(batch):
        if any(len(s) != len(batch) or s[k][0] != name for s in singles):
            return {"first": None, "note": f"the graphs differ in structure at node {k} ({name})"}
        token_axes = [ax for ax in range(b.ndim) if b.shape[ax] == n and singles[0][k][2].shape[ax] == 1]
        if len(token_axes) != 1 or any(s[k][2].shape[:token_axes[0]] + s[k][2].shape[token_axes[0] + 1:]
                                       != b.shape[:token_axes[0]] + b.shape[token_axes[0] + 1:] for s in singles):
            skipped += 1
            continue
        compared += 1
        ax = token_axes[0]
        for j, s in enumerate(singles):
            row, single = np.take(b, [j], axis=ax), s[k][2]
            if name.startswith("kq-"):  # the cells row j attends to: positions up to n_past + j
                row, single = row[..., : n_past + j + 1], single[..., : n_past + j + 1]
            if not np.array_equal(row.view(np.uint32), single.view(np.uint32)):
                return {"first": f"{name} ({op})", "row": j, "max_abs_diff": float(np.nanmax(np.abs(row - single))),
                        "compared": compared, "skipped": skipped}
    return {"first": None, "compared": compared, "skipped": skipped}


def run_one(model: str, setting: str, nodes: bool) -> dict:
    """In this process: one model under one setting (the environment is already set)."""
    import numpy as np
    import llama_cpp.llama_cpp as low

    import ngramcache.integrations.llama as nl
    from ngramcache.integrations.exactness import build_info, check_prompt, measure_exactness

    _, kw = SETTINGS[setting]
    recorder = NodeRecorder() if nodes else None
    if recorder is not None:
        default = low.llama_context_default_params

        def with_callback():
            p = default()
            p.cb_eval = recorder.callback
            return p

        low.llama_context_default_params = with_callback
    llm = nl.make_llama(model, n_ctx=1024, **kw)
    report = measure_exactness(llm)
    out = {"model": os.path.basename(llm.model_path), "setting": setting, "rows": report.rows,
           "rows_equal": report.rows_equal, "max_abs_diff": report.max_abs_diff,
           "first_argmax_flip": report.first_argmax_flip, "llamafile": build_info()["llamafile"],
           "weight_repacking": report.weight_repacking, "tiled_mm": report.tiled_mm}
    if recorder is not None:
        m = nl.LlamaBackend.of(llm)
        toks = m.tokenize(check_prompt())[:400]
        step = [int(t) for t in m.tokenize(" the harbour opens in April and the pump is checked")[1:9]]
        n = len(step)
        m.clear()
        m.decode(toks, 0, len(toks))
        singles = []
        for i, t in enumerate(step):
            recorder.nodes, recorder.on = [], True
            m.decode([t], len(toks) + i, 0)
            recorder.on = False
            singles.append(recorder.nodes)
        m.truncate(len(toks))
        recorder.nodes, recorder.on = [], True
        m.decode(step, len(toks), 0)
        recorder.on = False
        out["nodes"] = first_differing_node(singles, recorder.nodes, n, len(toks))
        out["nodes"]["total"] = len(recorder.nodes)
        del np
    llm.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", help="packaged name or .gguf (default: smollm2 and gemma)")
    ap.add_argument("-s", "--setting", action="append", choices=list(SETTINGS), help="default: all")
    ap.add_argument("--nodes", action="store_true", help="also name the first graph node whose rows differ")
    ap.add_argument("--json", action="store_true", help="one JSON object a line")
    ap.add_argument("--build", metavar="DIR", help="a folder holding another build's llama_cpp package")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "SETTING"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(*args.child, args.nodes)))
        return 0
    for model in args.model or ["smollm2", "gemma"]:
        for setting in args.setting or list(SETTINGS):
            env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_CPU_")}
            env.update(SETTINGS[setting][0])
            if args.build:
                env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(args.build), env.get("PYTHONPATH", "")])
            cmd = [sys.executable, __file__, "--child", model, setting] + (["--nodes"] if args.nodes else [])
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{model} {setting}: failed\n{proc.stderr}", file=sys.stderr)
                return 1
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            if args.json:
                print(json.dumps(row), flush=True)
                continue
            flip = row["first_argmax_flip"]
            build = "llamafile" if row["llamafile"] else "no llamafile"
            line = (f"{row['model']:<32} {build:<12} {setting:<13} rows equal {row['rows_equal']:>2}/{row['rows']}  "
                    f"max |diff| {row['max_abs_diff']:<9.4g} first argmax flip {'-' if flip is None else flip}")
            if "nodes" in row:
                nd = row["nodes"]
                line += f"  first differing node: {nd.get('first') or '-'} ({nd.get('compared')} compared)"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
