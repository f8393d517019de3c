"""`ngramcache stats`: llama-lookup-stats, plus the figures it does not print."""

from __future__ import annotations

import argparse
import json
import os
import sys

DEFAULT_N_CTX = 4096
DEFAULT_N_DRAFT = 3  # llama.cpp's --spec-draft-n-max default since 2026-05-19

EPILOG = """\
Replays the text as llama-lookup-stats does: chunks of -c tokens (the final chunk is
skipped unless a token follows it), each from an empty context cache, drafting up to
--spec-draft-n-max tokens per step and accepting those that match the text; after each
chunk its context cache is merged into the dynamic cache (in memory only: -lcd is never
written). It prints llama-lookup-stats' summary block, then where accepted drafts came
from, acceptance by draft position, overlap, timings and memory.

examples:
  python -m ngramcache stats -m SmolLM2.gguf -f prose.txt -c 4096 --spec-draft-n-max 8
  python -m ngramcache stats --tokens prose.tokens.i32 -lcs corpus.ngst --json
  python -m ngramcache stats --tokens prose.tokens.i32 -lcs lookup.bin --plot accept.png

exit status: 0 ok, 1 unreadable file or missing optional module, 2 bad arguments or an
input too short for one chunk.
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "stats",
        help="replay a text and report how well lookup drafting would do (llama-lookup-stats)",
        description="Measure n-gram lookup drafting on a text, offline: llama-lookup-stats' "
                    "numbers and more.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inp = p.add_argument_group("input (-f with a tokenizer, or --tokens)")
    inp.add_argument("-f", "--file", metavar="FNAME", help="text file to replay (tokenized like llama.cpp's -f)")
    inp.add_argument("-m", "--model", metavar="FNAME", help="GGUF model whose tokenizer reads -f (needs llama-cpp-python)")
    inp.add_argument("--tokenizer-json", metavar="FNAME",
                     help="a Hugging Face tokenizer.json to read -f with, instead of -m")
    inp.add_argument("--no-escape", action="store_true",
                     help="do not process escapes (\\n, \\t, \\xHH ...) in the text; llama.cpp does by default")
    inp.add_argument("--piece-size", type=int, default=None, metavar="BYTES",
                     help="tokenize long texts in pieces of this many bytes (default 64 KiB; "
                          "0 = one call, exactly llama.cpp's tokens for any tokenizer)")
    inp.add_argument("--tokens", metavar="FNAME",
                     help="already tokenized input: raw little-endian int32 token ids (no header) or .npy")
    c = p.add_argument_group("caches")
    c.add_argument("-lcs", "--lookup-cache-static", metavar="FNAME",
                   help="static cache: an ngramcache static table or a llama.cpp lookup.bin "
                        "(told apart by the header)")
    c.add_argument("-lcd", "--lookup-cache-dynamic", metavar="FNAME",
                   help="dynamic cache (llama.cpp lookup.bin); a missing file is ignored, as in llama.cpp")
    r = p.add_argument_group("replay")
    r.add_argument("-c", "--ctx-size", type=int, default=DEFAULT_N_CTX, metavar="N",
                   help=f"chunk size in tokens, >= 2 (default: {DEFAULT_N_CTX})")
    r.add_argument("--spec-draft-n-max", type=int, default=DEFAULT_N_DRAFT, metavar="N", dest="n_draft",
                   help=f"most tokens drafted per step, >= 0 (default: {DEFAULT_N_DRAFT}, as llama.cpp)")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print every figure as one JSON object instead")
    o.add_argument("--plot", metavar="PNG",
                   help="also draw acceptance by draft position and by source to this PNG (needs matplotlib)")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress bar or notes on stderr")
    p.set_defaults(run=run)
    return p


def _fail(code: int, msg: str) -> int:
    print(f"ngramcache stats: error: {msg}", file=sys.stderr)
    return code


def _note(args, msg: str) -> None:
    if not args.quiet:
        print(msg, file=sys.stderr)


def _tokenize(args):
    from ..progress import Progress
    from ..tokenizers import load_tokenizer, tokenize_files

    tok = load_tokenizer(model=args.model, tokenizer_json=args.tokenizer_json)
    with Progress(total=os.path.getsize(args.file), desc="tokenizing", unit="B", quiet=args.quiet) as bar:
        return tokenize_files([args.file], tok, escape=not args.no_escape, progress=bar,
                              piece_bytes=args.piece_size)


def run(args) -> int:
    from ..progress import Progress, fmt_seconds
    from ..stats import load_dynamic, load_static, replay
    from ..files import read_tokens_file
    import dataclasses
    import time

    n_ctx, n_draft = args.ctx_size, args.n_draft
    if n_ctx < 2:
        return _fail(2, f"-c/--ctx-size must be >= 2 (it is the chunk size in tokens), got {n_ctx}")
    if n_draft < 0:
        return _fail(2, f"--spec-draft-n-max must be >= 0, got {n_draft}")
    if (args.file is None) == (args.tokens is None):
        return _fail(2, "give the input as -f TEXT (with -m MODEL.gguf) or as --tokens FILE, exactly one of them")
    if args.tokens is not None and (args.model or args.tokenizer_json):
        _note(args, "note: --tokens is already tokenized; -m/--tokenizer-json are not used")
    if args.file is not None and not (args.model or args.tokenizer_json):
        return _fail(2, "-f needs a tokenizer: -m MODEL.gguf (or --tokenizer-json tokenizer.json)")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail(1, "--plot needs matplotlib, which is not installed: "
                            "pip install 'ngramcache[plot]' (or pip install matplotlib)")

    # Input tokens.
    try:
        if args.tokens is not None:
            tokens = read_tokens_file(args.tokens)
        else:
            t0 = time.perf_counter()
            tokens = _tokenize(args)
            _note(args, f"tokenized {args.file}: {len(tokens):,} tokens in {fmt_seconds(time.perf_counter() - t0)}")
    except (OSError, ValueError) as e:
        return _fail(1, f"cannot read the input: {e}")
    except ImportError as e:
        return _fail(1, f"cannot tokenize {args.file}: {e}")
    n_input = len(tokens)
    if n_input <= n_ctx:
        return _fail(2, f"the input has {n_input:,} tokens, too few to replay: stats needs more than one "
                        f"chunk of -c {n_ctx} tokens (at least {n_ctx + 1}); use a longer text or a smaller -c")

    # Caches, timed together as llama.cpp's t_draft_flat.
    static = dynamic = None
    static_kind, static_load_s, dynamic_load_s = "none", None, None
    if args.lookup_cache_static is not None:
        try:
            static, static_kind, static_load_s = load_static(args.lookup_cache_static)
        except (OSError, ValueError) as e:
            return _fail(1, f"failed to open static lookup cache: {args.lookup_cache_static}: {e}")
    if args.lookup_cache_dynamic is not None:
        if not os.path.exists(args.lookup_cache_dynamic):
            _note(args, f"note: dynamic cache {args.lookup_cache_dynamic} does not exist; starting from an "
                        "empty one (as llama.cpp does)")
        else:
            try:
                dynamic, dynamic_load_s = load_dynamic(args.lookup_cache_dynamic)
            except (OSError, ValueError) as e:
                return _fail(1, f"failed to open dynamic lookup cache: {args.lookup_cache_dynamic}: {e}")

    n_replay = (n_input - 1) // n_ctx * n_ctx
    with Progress(total=n_replay, desc="replay", unit="tok", quiet=args.quiet) as bar:
        stats = replay(tokens, n_ctx, n_draft, static=static, dynamic=dynamic,
                       progress=lambda done, total: bar.update(done - bar.n))
    stats = dataclasses.replace(stats, static_kind=static_kind, static_load_s=static_load_s,
                                dynamic_load_s=dynamic_load_s,
                                t_draft_flat=(static_load_s or 0.0) + (dynamic_load_s or 0.0))

    if args.json:
        print(json.dumps(stats.to_dict(), indent=2))
    else:
        sys.stdout.write(stats.summary())
        print()
        sys.stdout.write(stats.table())
    if args.plot is not None:
        try:
            stats.plot(args.plot)
        except OSError as e:
            return _fail(1, f"cannot write the plot {args.plot}: {e}")
        _note(args, f"wrote {args.plot}")
    return 0
