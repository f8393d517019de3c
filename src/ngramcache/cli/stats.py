"""`ngramcache stats`: llama-lookup-stats, plus the figures it does not print."""

from __future__ import annotations

import os

from ngramcache.cli._common import (InputError, RunError, Timer, UsageError, add_output_flags, check_output_path, check_ranges, command_parser,
                      emit, note)
from ngramcache.cli._drafters import (add_draft_length_flag, add_drafter_flags, build_drafter, check_draft_length,
                                      drafter_options)
from ngramcache.cli._inputs import add_text_input, check_text_input, read_text_input
from ngramcache.defaults import MAX_REPLAY_DRAFT, N_DRAFT, STATS_N_DRAFT

DEFAULT_N_CTX = 4096

HELP = "measure drafting on a text, offline (llama-lookup-stats)"
DESCRIPTION = ("Measure n-gram lookup drafting on a text, offline: llama-lookup-stats' numbers and more.")

EPILOG = f"""\
Replays the text as llama-lookup-stats does: chunks of -c tokens (the final chunk is
skipped unless a token follows it), each from an empty context cache, drafting up to
--spec-draft-n-max tokens per step and accepting those that match the text; after each
chunk its context cache is merged into the dynamic cache (in memory only: -lcd is never
written). It prints llama-lookup-stats' summary block, then where accepted drafts came
from, acceptance by draft position, overlap, timings and memory.

--drafter NAME replays another drafter the same way (each chunk is a request; what the
drafter keeps across requests carries over), in C++ for a drafter with a compiled core, so
that drafters can be compared on one text: acceptance, drafted tokens, the accepted-length
histogram and us per drafted token.

--gate replays the drafter behind the gate that generate, serve and chat use (docs/gate.md):
at every step the gate decides how many of the proposal's tokens are verified, and learns
from every proposal scored against the text, the declined ones too. A step that verifies k
drafted tokens costs cost(k+1) one-token steps (--costs; default: the package's prior curve
for llama.cpp), a plain step 1; it prints the modelled speed-up over plain decoding, the
tokens drafted and accepted under the gate, and the share of steps that drafted.

The defaults, --drafter lookup and --spec-draft-n-max {STATS_N_DRAFT}, are llama-lookup-stats' own, on
purpose: the figures compare with llama.cpp's. generate, serve and chat draft with copy, up
to {N_DRAFT} tokens, of which adaptive drafting verifies only what pays on the model; give
--drafter copy --spec-draft-n-max {N_DRAFT} to see what they would draft.

-lcs and -lcd: opening a .ngst checks its header and section bounds, not its contents, so
a file damaged past its header opens and replays (exit status 0); a lookup.bin is read
whole and its structure checked, but it has no checksum. 'ngramcache info --verify FILE'
checks every section's checksum of a .ngst.

examples:
  python -m ngramcache stats -m SmolLM2.gguf -f prose.txt -c 4096 --spec-draft-n-max 8
  python -m ngramcache stats --tokens prose.tokens.i32 -lcs corpus.ngst --json
  python -m ngramcache stats --tokens prose.tokens.i32 -lcs lookup.bin --plot accept.png
  python -m ngramcache stats --tokens prose.tokens.i32 --drafter suffix --spec-draft-n-max 16
  python -m ngramcache stats --tokens out.tokens.i32 --drafter copy --spec-draft-n-max 16 --gate \
      --costs 1,1.6,2.0,2.5

exit status: 0 ok, 1 unreadable file or missing optional module, 2 bad arguments or an
input too short for one chunk.
"""


def add_parser(sub) -> None:
    p = command_parser(sub, "stats", run, help=HELP, description=DESCRIPTION, epilog=EPILOG)
    add_text_input(p, "input (text and a tokenizer, or --tokens)")
    c = p.add_argument_group("caches")
    c.add_argument("-lcs", "--lookup-cache-static", metavar="FNAME",
                   help="static cache: an ngramcache static table or a llama.cpp lookup.bin "
                        "(told apart by the header)")
    c.add_argument("-lcd", "--lookup-cache-dynamic", metavar="FNAME",
                   help="dynamic cache (llama.cpp lookup.bin); a missing file is ignored, as in llama.cpp")
    r = p.add_argument_group("replay")
    r.add_argument("-c", "--ctx-size", type=int, default=DEFAULT_N_CTX, metavar="N",
                   help=f"chunk size in tokens, >= 2 (default: {DEFAULT_N_CTX})")
    add_draft_length_flag(p, r, STATS_N_DRAFT, ", as llama.cpp", highest=MAX_REPLAY_DRAFT)
    r.add_argument("--no-llama-oob", action="store_false", dest="llama_oob",
                   help="treat 3- and 4-gram keys that reach before a chunk's start as not found, instead "
                        "of reading what llama.cpp reads there (docs/parity.md)")
    r.add_argument("--gate", action="store_true",
                   help="verify what the gate keeps of each proposal, and print the modelled speed-up "
                        "(not with --drafter lookup)")
    r.add_argument("--costs", metavar="C1,C2,...",
                   help="with --gate: cost(1), cost(2), ... of verifying 1, 2, ... tokens, relative to one "
                        "(extended linearly; default: the package's prior curve for llama.cpp)")
    add_drafter_flags(p, "lookup", "what drafts")
    o = p.add_argument_group("output")
    o.add_argument("--plot", metavar="PNG",
                   help="also draw acceptance by draft position and by source to this PNG (needs matplotlib)")
    add_output_flags(p, "every figure", group=o)


def _check_caches(args) -> None:
    """-lcs and -lcd, refused before any tokenizing when they are there but not files (a
    pipe would hang the replay, a device never end it); a missing one is the replay's to
    report, in llama.cpp's words."""
    from ngramcache.files import check_regular_file

    for path in (args.lookup_cache_static, args.lookup_cache_dynamic):
        if path is not None and os.path.exists(path):
            check_regular_file(path, "cache file")


def _costs(args) -> list[float] | None:
    """--costs as numbers (None: not given); a usage error unless positive finite numbers
    given with --gate."""
    import math

    if args.costs is None:
        return None
    if not args.gate:
        raise UsageError("--costs applies to --gate: give --gate too")
    try:
        costs = [float(x) for x in args.costs.split(",")]
    except ValueError:
        costs = []
    if not costs or not all(c > 0 and math.isfinite(c) for c in costs):
        raise UsageError(f"--costs must be positive numbers separated by commas, cost(1), cost(2), ... of "
                         f"verifying 1, 2, ... tokens, got {args.costs!r}")
    return costs


def run(args) -> int:
    from ngramcache.progress import Progress, fmt_seconds
    from ngramcache.replays import replay, replay_drafter

    check_ranges(args, [("ctx_size", 2, "-c/--ctx-size must be >= 2 (it is the chunk size in tokens)")])
    check_draft_length(args)
    check_text_input(args)
    drafter = None  # None: llama.cpp's lookup, replayed exactly as llama-lookup-stats
    options = drafter_options(args)  # an option of another drafter is a usage error
    costs = _costs(args)
    if args.gate and args.drafter == "lookup":
        raise UsageError("--gate applies to the drafters that ngramcache replays (--drafter copy, suffix, ...), "
                         "not to --drafter lookup, which stats replays as llama-lookup-stats does, ungated")
    if args.drafter != "lookup":
        if args.lookup_cache_static is not None or args.lookup_cache_dynamic is not None:
            raise UsageError(f"-lcs and -lcd apply to --drafter lookup, not {args.drafter}")
        drafter = build_drafter(args, n_draft=args.n_draft)
    elif options:
        raise UsageError(f"stats replays --drafter lookup as llama-lookup-stats does, with n-grams of 1 to 4 "
                         f"tokens: {', '.join(options)} cannot be set")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise RunError("--plot needs matplotlib, which is not installed: "
                           "pip install 'ngramcache[plot]' (or pip install matplotlib)") from None
        check_output_path(args.plot)

    _check_caches(args)
    timer = Timer()
    tokens, _ = read_text_input(args, timer)
    if args.files:
        note(args, f"tokenized {', '.join(args.files)}: {len(tokens):,} tokens in {fmt_seconds(timer.total)}")
    n_ctx, n_input = args.ctx_size, len(tokens)
    if n_input <= n_ctx:
        raise InputError(f"the input has {n_input:,} tokens, too few to replay: stats needs more than one "
                         f"chunk of -c {n_ctx} tokens (at least {n_ctx + 1}); use a longer text or a smaller -c")

    dynamic = args.lookup_cache_dynamic
    if dynamic is not None and not os.path.exists(dynamic):
        note(args, f"note: dynamic cache {dynamic} does not exist; starting from an empty one (as llama.cpp does)")
        dynamic = None
    n_replay = (n_input - 1) // n_ctx * n_ctx
    with Progress(total=n_replay, desc="replay", unit="tok", quiet=args.quiet) as bar:
        progress = lambda done, total: bar.update(done - bar.n)  # noqa: E731
        if drafter is None:
            stats = replay(tokens, n_ctx, args.n_draft, static=args.lookup_cache_static, dynamic=dynamic,
                           progress=progress, llama_oob=args.llama_oob)
        else:
            gate = None
            if args.gate:
                from ngramcache.decoding.gate import GateSettings

                gate = GateSettings()
            stats = replay_drafter(tokens, drafter, n_ctx, args.n_draft, progress=progress, gate=gate, costs=costs)

    emit(args, stats.to_dict(), text=stats.summary() + "\n" + stats.table(), json_indent=2)
    if args.plot is not None:
        try:
            stats.plot(args.plot)
        except OSError as e:
            raise RunError(f"cannot write the plot {args.plot}: {e.strerror or e}") from None
        note(args, f"wrote {args.plot}")
    return 0
