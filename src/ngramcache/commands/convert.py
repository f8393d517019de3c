"""``ngramcache convert``: between ngramcache static tables (.ngst) and llama.cpp's lookup.bin."""

from __future__ import annotations

import argparse
import os

from ._common import (FORMATS, Timer, UsageError, add_output_flags, cache_figures, check_output_path, finish, guarded,
                      input_format, output_format, static_table_class, table_figures)

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
    p = sub.add_parser("convert", help="convert a cache between .ngst and llama.cpp's lookup.bin",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="IN", help="cache file to read (either format)")
    p.add_argument("output", metavar="OUT", help="file to write")
    p.add_argument("--format", choices=FORMATS, help="output format (default: from OUT's extension)")
    p.add_argument("--ngram-size", type=int, choices=(1, 2, 3, 4), metavar="N",
                   help="lookup.bin -> .ngst: keep only the keys of N tokens (needed for a context or "
                        "dynamic cache, which holds sizes 1-4; a static table holds one size)")
    add_output_flags(p)
    p.set_defaults(run=run, _parser=p)


@guarded("convert")
def run(args) -> int:
    from ..cache import NgramCache

    fmt = output_format(args.output, args.format)
    check_output_path(args.output, [args.input])
    in_fmt = input_format(args.input)
    if args.ngram_size is not None and not (in_fmt == "llama" and fmt == "ngst"):
        raise UsageError("--ngram-size applies only to converting a lookup.bin into a static table (.ngst)")
    timer = Timer()
    if in_fmt == "llama" and fmt == "llama":
        with timer.stage("read"):
            cache = NgramCache.load(args.input)
        with timer.stage("write"):
            cache.save(args.output)
        figures = cache_figures(cache)
    else:
        StaticTable = static_table_class()
        with timer.stage("read"):
            if in_fmt == "llama":
                table = StaticTable.from_llama(args.input, ngram_size=args.ngram_size)
            else:
                table = StaticTable.open(args.input)
        with timer.stage("write"):
            if fmt == "llama":
                table.to_llama(args.output)
            else:
                table.save(args.output)
        figures = table_figures(table)
    summary = {"command": "convert", "input": args.input, "input_format": in_fmt,
               "keys": figures["keys"], "entries": figures["entries"], "total_count": figures["total_count"],
               "output": args.output, "format": fmt, "file_bytes": os.path.getsize(args.output)}
    return finish(args, summary, timer)
