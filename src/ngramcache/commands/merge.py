"""``ngramcache merge``: add up n-gram caches, like llama-lookup-merge."""

from __future__ import annotations

import argparse
import os

from ._common import (FORMATS, Timer, UsageError, add_output_flags, cache_figures, cache_to_table, check_output_path,
                      finish, guarded, input_format, load_cache, output_format)

DESCRIPTION = """\
Merge n-gram caches into one, as llama-lookup-merge does: the counts of equal
(n-gram, next token) pairs are added. The inputs may mix the two formats (ngramcache
static tables, .ngst, and llama.cpp lookup.bin files); the last argument is the output,
written in the format its extension names (.ngst or .bin) or --format. With a single
input, merge copies it (converting the format if asked)."""

EPILOG = """\
examples:
  ngramcache merge part1.bin part2.bin merged.bin
  ngramcache merge code.ngst prose.bin all.ngst"""


def add_parser(sub) -> None:
    p = sub.add_parser("merge", help="add up caches of either format (like llama-lookup-merge)",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="FILE", help="input caches, then the output file")
    p.add_argument("--format", choices=FORMATS, help="output format (default: from the output's extension)")
    add_output_flags(p)
    p.set_defaults(run=run, _parser=p)


@guarded("merge")
def run(args) -> int:
    from ..progress import Progress

    if len(args.paths) < 2:
        raise UsageError("need at least one input and the output: merge IN... OUT")
    *inputs, out = args.paths
    fmt = output_format(out, args.format)
    check_output_path(out, inputs)
    formats = [input_format(p) for p in inputs]  # every input checked before the slow part
    timer = Timer()
    merged = None
    with timer.stage("load and merge"), Progress(total=len(inputs), desc="merging", unit="files",
                                                 quiet=args.quiet) as bar:
        for path, f in zip(inputs, formats):
            cache = load_cache(path, f)
            if merged is None:
                merged = cache
            else:
                merged.merge(cache)
                del cache
            bar.update(1)
    with timer.stage("write"):
        if fmt == "llama":
            merged.save(out)
        else:
            cache_to_table(merged, os.path.dirname(os.path.abspath(out))).save(out)
    figures = cache_figures(merged)
    summary = {"command": "merge", "inputs": inputs, "input_formats": formats,
               "keys": figures["keys"], "entries": figures["entries"], "total_count": figures["total_count"],
               "output": out, "format": fmt, "file_bytes": os.path.getsize(out)}
    return finish(args, summary, timer)
