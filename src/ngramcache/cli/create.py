"""``ngramcache create``: build a static n-gram cache from text, like llama-lookup-create."""

from __future__ import annotations

import os

from ngramcache.cli import _stop
from ngramcache.cli._caches import add_format_flag, counts, finish, output_format, write_cache
from ngramcache.cli._common import Timer, UsageError, add_output_flags, check_output_path, check_ranges, command_parser, note
from ngramcache.cli._inputs import add_text_input, check_text_input, read_text_input, text_files

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
exactly llama.cpp's tokens.

On a Dask cluster (pip install 'ngramcache[distributed]'), the files are sharded over the
workers and their counts merged into the same file, byte for byte:
  ngramcache create --workers 4 -m smollm2 -f corpus/ -lcs corpus.ngst        (local processes)
  ngramcache create --scheduler tcp://host:8786 -m /models/m.gguf -f /data/corpus -lcs c.ngst"""


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
    dist = p.add_argument_group("distributed counting (needs the 'distributed' extra: Dask)")
    dist.add_argument("--workers", type=int, default=None, metavar="N",
                      help="count on a local Dask cluster of N worker processes (without --workers or "
                           "--scheduler, create counts in this process)")
    dist.add_argument("--scheduler", metavar="ADDRESS",
                      help="count on the workers of a running Dask scheduler, e.g. tcp://host:8786 (every "
                           "worker needs ngramcache and the model or tokenizer file at the same path)")
    dist.add_argument("--shard-size", type=int, default=None, metavar="BYTES",
                      help="text per shard (default: the input split in 4 shards a worker, "
                           "between 256 KiB and 64 MiB)")


def _count_llama(tokens, quiet: bool):
    from ngramcache.cache import NgramCache
    from ngramcache.progress import Progress
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
    from ngramcache.progress import Progress
    from ngramcache.static_table import StaticTable
    with Progress(total=None, desc="counting", unit="tok", quiet=quiet) as bar:
        table = StaticTable.build(tokens, ngram_size=NGRAM_SIZE)
        bar.update(tokens.size)
    return table


def _write(cache, path: str, fmt: str) -> None:
    _stop.pause_point("writing")
    write_cache(cache, path, fmt)


def _sharded(args) -> bool:
    """Whether counting runs on Dask workers; checks the flags that go with it."""
    check_ranges(args, [("workers", 1, "--workers must be at least 1"),
                        ("shard_size", 1, "--shard-size must be at least 1")])
    if args.workers is not None and args.scheduler:
        raise UsageError("give --workers N (a local cluster) or --scheduler ADDRESS (a running one), not both")
    if not (args.scheduler or args.workers):
        if args.shard_size is not None:
            raise UsageError("--shard-size goes with --workers N or --scheduler ADDRESS")
        return False
    if args.tokens:
        raise UsageError("--workers and --scheduler shard text (-f FILE with a tokenizer); "
                         "--tokens is counted in this process")
    if args.save_tokens:
        raise UsageError("--save-tokens needs every token in this process: leave out --workers/--scheduler")
    if args.jobs is not None:
        raise UsageError("-j/--jobs sets tokenizer processes of a single-process create; with --workers "
                         "or --scheduler every Dask worker tokenizes its own shards")
    from ngramcache.corpus.sharded import _distributed
    _distributed()  # before any work: Dask missing is one line naming the extra
    return True


def _run_sharded(args, fmt: str) -> int:
    from ngramcache.progress import Progress
    from ngramcache.corpus.sharded import close_client, connect, create_sharded, local_client
    from ngramcache.corpus.tokenizers import load_tokenizer

    timer = Timer()
    files, skipped = text_files(args)
    with timer.stage("load tokenizer"):
        # Checked here, so that a bad path fails before any worker starts; the workers
        # open the same path themselves.
        tok = load_tokenizer(model=args.model, tokenizer_json=args.tokenizer)
    with timer.stage("connect" if args.scheduler else "start cluster"):
        client = connect(args.scheduler) if args.scheduler else local_client(args.workers)
    total = sum(f.stat().st_size for f in files)
    try:
        with Progress(total=total, desc="counting shards", unit="B", quiet=args.quiet) as bar:
            result = create_sharded(files, args.output, fmt, client, tokenizer_spec=tok.spec,
                                    escape=not args.no_escape, piece_bytes=args.piece_size,
                                    shard_bytes=args.shard_size, ngram_size=NGRAM_SIZE, progress=bar,
                                    timer=timer, save=_stop.save)
    finally:
        with timer.stage("disconnect" if args.scheduler else "stop cluster"):
            close_client(client)
    summary = {"command": "create", "inputs": [str(f) for f in files], "input_bytes": total}
    if skipped:
        summary["skipped_binary_files"] = [str(s) for s in skipped]
    summary.update(tokenizer=tok.path, engine="dask", scheduler=args.scheduler or f"local:{args.workers}",
                   shards=result["shards"], tokens=result["tokens"])
    summary.update({k: result[k] for k in ("keys", "entries", "total_count")})
    summary.update(output=args.output, format=fmt, file_bytes=os.path.getsize(args.output))
    return finish(args, summary, timer)


def run(args) -> int:
    from ngramcache.files import write_tokens_file

    check_text_input(args)
    if _sharded(args):
        fmt = output_format(args.output, args.format)
        check_output_path(args.output, list(args.files))
        return _run_sharded(args, fmt)
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
    _stop.pause_point("counting")
    with timer.stage("count"):
        cache = (_count_llama if fmt == "llama" else _count_ngst)(tokens, args.quiet)
    with timer.stage("write"):
        _stop.save(_write, cache, args.output, fmt)
    summary.update(counts(cache))
    summary.update(output=args.output, format=fmt, file_bytes=os.path.getsize(args.output))
    return finish(args, summary, timer, children=not args.tokens)
