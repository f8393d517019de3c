"""``ngramcache create``: build a static n-gram cache from text, like llama-lookup-create."""

from __future__ import annotations

import argparse
import os

from ._common import (FORMATS, RunError, Timer, UsageError, add_output_flags, cache_figures, check_output_path,
                      finish, guarded, note, output_format, static_table_class, table_figures)

NGRAM_SIZE = 2  # llama.cpp's static cache: LLAMA_NGRAM_STATIC
COUNT_CHUNK = 1 << 20  # tokens per update call, so counting can show progress

DESCRIPTION = """\
Tokenize a text corpus and count its 2-grams (each pair of tokens followed by the next
token), as llama-lookup-create does, then write the static cache: an ngramcache static
table (.ngst, opened in O(1) with mmap) or llama.cpp's lookup.bin format (--format llama).

Text is handled exactly as llama.cpp handles -f FILE: one trailing newline dropped, escape
sequences (\\n \\t \\xHH ...) processed unless --no-escape, then tokenized with the model's
special tokens (BOS if the model adds one; special-token text parsed). Several files, or
directories (all their files, recursively, in path order; binary files skipped), are
tokenized one by one and their tokens concatenated."""

EPILOG = """\
examples:
  ngramcache create -m model.gguf -f corpus.txt -lcs corpus.ngst
  ngramcache create -m smollm2 -f src/ -f notes.txt -lcs lookup.bin        (llama.cpp format)
  ngramcache create --tokens corpus.tokens.i32 -lcs corpus.ngst
  ngramcache create --tokenizer tokenizer.json -f corpus.txt -lcs corpus.ngst

Long files are tokenized in pieces of --piece-size bytes, in -j worker processes; a piece
boundary can change a few tokens for some tokenizers (see docs/cli.md); --piece-size 0 gives
exactly llama.cpp's tokens."""


def add_parser(sub) -> None:
    p = sub.add_parser("create", help="build a static cache from text (like llama-lookup-create)",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("input (text and a tokenizer, or tokens)")
    src.add_argument("-m", "--model", metavar="MODEL",
                     help="GGUF model whose tokenizer to use (only its vocabulary is loaded), "
                          "or a packaged model: smollm2, gemma")
    src.add_argument("--tokenizer", "--tokenizer-json", dest="tokenizer", metavar="TOKENIZER_JSON",
                     help="Hugging Face tokenizer.json to use instead of a GGUF model (needs the 'tokenizers' package)")
    src.add_argument("-f", "--file", dest="files", action="extend", nargs="+", metavar="PATH", default=[],
                     help="text file or directory to read; repeat or list several")
    src.add_argument("--tokens", metavar="FILE",
                     help="read token ids instead of text: raw little-endian int32, or .npy")
    src.add_argument("--no-escape", action="store_true",
                     help="do not process escape sequences (llama.cpp's --no-escape)")
    src.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                     help="tokenizer worker processes for long texts (default: one less than the CPUs; 1 = none)")
    src.add_argument("--piece-size", type=int, default=None, metavar="BYTES",
                     help="tokenize long texts in pieces of about this many bytes (default 65536; "
                          "0 = one tokenizer call per file, exactly as llama.cpp)")
    out = p.add_argument_group("output")
    out.add_argument("-lcs", "--lookup-cache-static", dest="output", metavar="OUT", required=True,
                     help="file to write (.ngst: static table; .bin: llama.cpp lookup.bin)")
    out.add_argument("--format", choices=FORMATS,
                     help="output format (default: from OUT's extension)")
    out.add_argument("--save-tokens", metavar="FILE",
                     help="also write the tokens (raw little-endian int32) for reuse with --tokens")
    add_output_flags(p)
    p.set_defaults(run=run, _parser=p)


def _check_args(args) -> None:
    if args.tokens and (args.files or args.model or args.tokenizer):
        raise UsageError("--tokens replaces -m/--tokenizer and -f; give either --tokens FILE or a tokenizer and -f FILE")
    if not args.tokens:
        if not args.files:
            raise UsageError("no input: give -f FILE (with -m MODEL or --tokenizer) or --tokens FILE")
        if bool(args.model) == bool(args.tokenizer):
            raise UsageError("give exactly one tokenizer: -m MODEL.gguf or --tokenizer tokenizer.json")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"-j/--jobs must be at least 1, got {args.jobs}")
    if args.piece_size is not None and args.piece_size < 0:
        raise UsageError(f"--piece-size must be >= 0, got {args.piece_size}")


def _count_llama(tokens, quiet: bool):
    from ..cache import NgramCache
    from ..progress import Progress
    cache = NgramCache()
    n = tokens.size
    with Progress(total=n, desc="counting", unit="tok", quiet=quiet) as bar:
        for a in range(0, n, COUNT_CHUNK):
            b = min(n, a + COUNT_CHUNK)
            # The slice starts NGRAM_SIZE tokens early: the n-grams ending in [a, b) need them.
            lo = max(0, a - NGRAM_SIZE)
            cache.update(tokens[lo:b], NGRAM_SIZE, NGRAM_SIZE, nnew=b - a)
            bar.update(b - a)
    return cache


@guarded("create")
def run(args) -> int:
    from ..progress import Progress
    from ..files import expand_inputs, read_tokens_file, write_tokens_file
    from ..tokenizers import load_tokenizer, tokenize_files

    _check_args(args)
    fmt = output_format(args.output, args.format)
    if fmt == "ngst":
        static_table_class()  # fail now, not after tokenizing
    inputs = [args.tokens] if args.tokens else list(args.files)
    check_output_path(args.output, inputs)
    timer = Timer()
    summary: dict = {"command": "create"}

    if args.tokens:
        with timer.stage("read"):
            tokens = read_tokens_file(args.tokens)
        summary["inputs"] = [args.tokens]
        children = False
    else:
        files, skipped = expand_inputs(args.files)
        if not files:
            raise RunError("no text files found in " + ", ".join(args.files)
                           + (f" ({len(skipped)} binary files skipped)" if skipped else ""))
        for s in skipped:
            note(args, f"create: skipping binary file {s}")
        with timer.stage("load tokenizer"):
            tok = load_tokenizer(model=args.model, tokenizer_json=args.tokenizer)
        total = sum(f.stat().st_size for f in files)
        with timer.stage("tokenize"), Progress(total=total, desc="tokenizing", unit="B", quiet=args.quiet) as bar:
            tokens = tokenize_files(files, tok, escape=not args.no_escape, jobs=args.jobs, progress=bar,
                                    piece_bytes=args.piece_size)
        summary["inputs"] = [str(f) for f in files]
        summary["input_bytes"] = total
        if skipped:
            summary["skipped_binary_files"] = [str(s) for s in skipped]
        summary["tokenizer"] = tok.path
        children = True
        if args.save_tokens:
            with timer.stage("save tokens"):
                write_tokens_file(args.save_tokens, tokens)
            summary["tokens_file"] = args.save_tokens
    summary["tokens"] = int(tokens.size)
    if tokens.size <= NGRAM_SIZE:
        note(args, f"create: warning: only {tokens.size} tokens, too few for any {NGRAM_SIZE}-gram; "
                   f"the cache will be empty")

    if fmt == "llama":
        with timer.stage("count"):
            cache = _count_llama(tokens, args.quiet)
        with timer.stage("write"):
            cache.save(args.output)
        figures = cache_figures(cache)
        summary.update(keys=figures["keys"], entries=figures["entries"], total_count=figures["total_count"])
    else:
        StaticTable = static_table_class()
        with timer.stage("count"), Progress(total=None, desc="counting", unit="tok", quiet=args.quiet) as bar:
            table = StaticTable.build(tokens, ngram_size=NGRAM_SIZE)
            bar.update(tokens.size)
        with timer.stage("write"):
            table.save(args.output)
        figures = table_figures(table)
        summary.update(keys=figures["keys"], entries=figures["entries"], total_count=figures["total_count"])
    summary.update(output=args.output, format=fmt, file_bytes=os.path.getsize(args.output))
    return finish(args, summary, timer, children=children)
