"""``ngramcache convert``: between ngramcache static tables (.ngst) and llama.cpp's lookup.bin."""

from __future__ import annotations

import os

from ngramcache.cli import _stop
from ngramcache.cli._caches import add_format_flag, counts, finish, output_format, write_cache
from ngramcache.cli._common import Timer, UsageError, add_output_flags, check_output_path, command_parser

DESCRIPTION = """\
Convert a cache between the two formats: an ngramcache static table (.ngst) and llama.cpp's
lookup.bin (what llama-lookup-create writes and llama-lookup/-stats read with -lcs/-lcd).
The input's format is recognised from its content; the output's comes from its extension
(.ngst or .bin) or --format. Converting a file to its own format rewrites it (a check that
it reads back whole)."""

EPILOG = """\
examples:
  ngramcache convert static.lcs.bin static.ngst      (import llama.cpp's file)
  ngramcache convert static.ngst lookup.bin          (export for llama.cpp's tools)"""


def add_parser(sub) -> None:
    p = command_parser(sub, "convert", run, help="convert a cache between .ngst and llama.cpp's lookup.bin",
                       description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("input", metavar="IN", help="cache file to read (either format)")
    p.add_argument("output", metavar="OUT", help="file to write")
    add_format_flag(p)
    p.add_argument("--ngram-size", type=int, choices=(1, 2, 3, 4), metavar="N",
                   help="lookup.bin -> .ngst: keep only the keys of N tokens (needed for a context or "
                        "dynamic cache, which holds sizes 1-4; a static table holds one size)")
    add_output_flags(p)


def run(args) -> int:
    from ngramcache.files import cache_format, open_cache
    from ngramcache.static_table import StaticTable

    fmt = output_format(args.output, args.format)
    check_output_path(args.output, [args.input])
    in_fmt = cache_format(args.input)
    if args.ngram_size is not None and not (in_fmt == "llama" and fmt == "ngst"):
        raise UsageError("--ngram-size applies only to converting a lookup.bin into a static table (.ngst)")
    timer = Timer()
    with timer.stage("read"):
        if in_fmt == "llama" and fmt == "ngst":
            cache = StaticTable.from_llama(args.input, ngram_size=args.ngram_size)
        else:
            cache = open_cache(args.input)
            if isinstance(cache, StaticTable):
                cache.verify()  # opening checks only the header; a copy must not carry damage on
    with timer.stage("write"):
        _stop.save(write_cache, cache, args.output, fmt)
    summary = {"command": "convert", "input": args.input, "input_format": in_fmt, **counts(cache),
               "output": args.output, "format": fmt, "file_bytes": os.path.getsize(args.output)}
    return finish(args, summary, timer)
