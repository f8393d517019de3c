"""``ngramcache create``: build a static n-gram cache from text, like llama-lookup-create."""

from __future__ import annotations

import os

from ._caches import add_format_flag, counts, finish, output_format, write_cache
from ._common import Timer, UsageError, add_output_flags, check_output_path, command_parser, note
from ._inputs import add_text_input, check_text_input, read_text_input

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
    p = command_parser(sub, "create", run, help="build a static cache from text (like llama-lookup-create)",
                       description=DESCRIPTION, epilog=EPILOG)
    add_text_input(p)
    out = p.add_argument_group("output")
    out.add_argument("-lcs", "--lookup-cache-static", dest="output", metavar="OUT", required=True,
                     help="file to write (.ngst: static table; .bin: llama.cpp lookup.bin)")
    add_format_flag(out)
    out.add_argument("--save-tokens", metavar="FILE",
                     help="also write the tokens (raw little-endian int32) for reuse with --tokens "
                          "(with --tokens: a raw copy of them, e.g. of a .npy file)")
    add_output_flags(p, group=out)


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


def _count_ngst(tokens, quiet: bool):
    from ..progress import Progress
    from ..static_table import StaticTable
    with Progress(total=None, desc="counting", unit="tok", quiet=quiet) as bar:
        table = StaticTable.build(tokens, ngram_size=NGRAM_SIZE)
        bar.update(tokens.size)
    return table


def run(args) -> int:
    from ..files import write_tokens_file

    check_text_input(args)
    fmt = output_format(args.output, args.format)
    inputs = [args.tokens] if args.tokens else list(args.files)
    check_output_path(args.output, inputs)
    if args.save_tokens:
        check_output_path(args.save_tokens, inputs)
        if os.path.abspath(args.save_tokens) == os.path.abspath(args.output):
            raise UsageError(f"{args.output}: -lcs and --save-tokens name the same file")
    timer = Timer()
    tokens, summary = read_text_input(args, timer)
    summary = {"command": "create", **summary}
    if args.save_tokens:
        with timer.stage("save tokens"):
            write_tokens_file(args.save_tokens, tokens)
        summary["tokens_file"] = args.save_tokens
    summary["tokens"] = int(tokens.size)
    if tokens.size <= NGRAM_SIZE:
        note(args, f"create: warning: only {tokens.size} tokens, too few for any {NGRAM_SIZE}-gram; "
                   f"the cache will be empty")
    with timer.stage("count"):
        cache = (_count_llama if fmt == "llama" else _count_ngst)(tokens, args.quiet)
    with timer.stage("write"):
        write_cache(cache, args.output, fmt)
    summary.update(counts(cache))
    summary.update(output=args.output, format=fmt, file_bytes=os.path.getsize(args.output))
    return finish(args, summary, timer, children=not args.tokens)
