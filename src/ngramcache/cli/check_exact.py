"""`ngramcache check-exact`: whether a model's batched logits equal its single-token logits
on this machine's llama.cpp build, which is what makes speculative output identical to plain
decoding."""

from __future__ import annotations

import os
import sys

from ngramcache.cli._common import RunError, add_output_flags, check_ranges, command_parser, emit
from ngramcache.cli._inputs import add_model_flag, add_threads_flag

HELP = "check that batched logits equal single-token ones, bit for bit"
DESCRIPTION = ("Decode a fixed prompt one token at a time, decode the same tokens again in batches, and "
               "compare the logits: exact when every row is bitwise equal (then drafting never changes "
               "greedy output).")

EPILOG = """\
The prompt (about 600 tokens, shipped with ngramcache) is decoded greedily for 48 tokens,
one at a time; the same 48 tokens are then decoded in batches of 8 after the same prompt.
The answer is kept in ~/.cache/ngramcache/exactness.json (or $NGRAMCACHE_CACHE_DIR) per
model file, llama.cpp build, thread counts and settings; --refresh measures again.

"configuration" says what was checked, as make_llama loads it (and so generate, chat,
serve and demo): the kernels of one-token steps and verified drafts (the rows compared),
and whether prompts go through a repacked copy of the weights (faster on Q4_K, Q4_0 and
IQ4_NL matrices; a prompt needs no bitwise match, since plain and speculative decoding
both decode it there).

Not exact? The lines under "why" name the batch-size-dependent paths that were on:
llama.cpp built with its llamafile kernels (rebuild llama-cpp-python with
CMAKE_ARGS="-DGGML_LLAMAFILE=OFF" and pip's --no-cache-dir), weight repacking (--repack
turns it on to show its effect), GGML_CPU_TILED_MM not 0. docs/exactness.md says more.

exit status: 0 exact, 1 not exact (or a failure), 2 bad arguments.

examples:
  python -m ngramcache check-exact
  python -m ngramcache check-exact -m gemma --json
  python -m ngramcache check-exact -m my-model.Q4_K_M.gguf -t 4
"""


def add_parser(sub) -> None:
    p = command_parser(sub, "check-exact", run, help=HELP, description=DESCRIPTION, epilog=EPILOG)
    add_model_flag(p)
    add_threads_flag(p)
    p.add_argument("--refresh", action="store_true", help="measure again even if an answer is stored")
    p.add_argument("--repack", action="store_true",
                   help="load the model with weight repacking, as llama-cpp-python does by default "
                        "(ngramcache loads without it)")
    add_output_flags(p, "the report")


def run(args) -> int:
    import ngramcache.integrations.llama as nl
    from ngramcache.integrations.exactness import check_exact, configuration
    from ngramcache.models import model_path

    check_ranges(args, [("threads", 1, "-t must be >= 1")])
    path = model_path(args.model)
    if not (args.json or args.quiet):
        print(f"check-exact: {os.path.basename(path)}: measuring or loading the stored answer ...",
              file=sys.stderr, flush=True)
    llm = nl.make_llama(path, n_ctx=1024, n_threads=args.threads, exact=not args.repack)
    try:
        report = check_exact(llm, refresh=args.refresh)
        config = configuration(llm)
    finally:
        llm.close()
    result = report.as_dict()
    result["configuration"] = config
    flip = report.first_argmax_flip
    rows = [("model", os.path.basename(report.model)),
            ("rows equal", f"{report.rows_equal}/{report.rows} (batches of {report.chunk} against one token "
                           "at a time)"),
            ("max |diff|", f"{report.max_abs_diff:.6g}"),
            ("first argmax flip", "none" if flip is None else f"row {flip}"),
            ("verdict", report.verdict),
            ("configuration", config),
            ("llamafile kernels", "compiled in" if report.llamafile else "off"),
            ("weight repacking", "on" if report.weight_repacking else "off"),
            ("tiled matmul", {"off": "off", "on": "on", "unsure": "maybe on"}[report.tiled_mm]),
            ("threads", f"{report.n_threads} (batches: {report.n_threads_batch})"),
            ("measured", "earlier (stored answer)" if report.cached else f"now, in {report.seconds:.1f} s")]
    text = "".join(f"  why: {c}\n" for c in report.causes) if not report.exact else ""
    emit(args, result, title=None, rows=rows, text=text)
    if not report.exact:
        raise RunError(f"{os.path.basename(report.model)} is not exact here: drafting can change greedy output "
                       "after a near tie")
    return 0
