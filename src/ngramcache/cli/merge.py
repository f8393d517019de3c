"""``ngramcache merge``: add up n-gram caches, like llama-lookup-merge."""

from __future__ import annotations

import os

from ngramcache.cli import _stop
from ngramcache.cli._caches import add_format_flag, finish, output_format
from ngramcache.cli._common import Timer, UsageError, add_output_flags, check_output_path, command_parser

DESCRIPTION = """\
Merge n-gram caches into one, as llama-lookup-merge does: the counts of equal
(n-gram, next token) pairs are added. The inputs may mix the two formats (ngramcache
static tables, .ngst, and llama.cpp lookup.bin files); the last argument is the output,
written in the format its extension names (.ngst or .bin) or --format. With a single
input, merge copies it (converting the format if asked).

The inputs are read one at a time, each turned into counts sorted by key in a hidden
folder beside the output, and those are merged in one streaming pass: memory holds one
input, not all of them (docs/cli.md)."""

EPILOG = """\
examples:
  ngramcache merge part1.bin part2.bin merged.bin
  ngramcache merge code.ngst prose.bin all.ngst"""


def add_parser(sub) -> None:
    p = command_parser(sub, "merge", run, help="add up caches of either format (like llama-lookup-merge)",
                       description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("paths", nargs="+", metavar="FILE", help="input caches, then the output file")
    add_format_flag(p, "the output's extension")
    add_output_flags(p)


class _Sorting:
    """The progress of the inputs' reading and sorting, with the point a test can hold the
    merge at ("sorting": after the first input's sorted run is written)."""

    def __init__(self, bar):
        self.bar = bar
        self.done = 0

    def update(self, n: int) -> None:
        self.bar.update(n)
        self.done += n
        if self.done == n:
            _stop.pause_point("sorting")


class _Stages:
    """The merge's timer, with the point a test can hold it at ("writing": the output's
    merge begins)."""

    def __init__(self, timer):
        self.timer = timer

    def stage(self, name: str):
        if name == "merge":
            _stop.pause_point("writing")
        return self.timer.stage(name)


def run(args) -> int:
    from ngramcache.files import cache_format
    from ngramcache.progress import Progress
    from ngramcache.corpus.sharded import merge_cache_files

    if len(args.paths) < 2:
        raise UsageError("need at least one input and the output: merge IN... OUT")
    *inputs, out = args.paths
    fmt = output_format(out, args.format)
    check_output_path(out, inputs)
    formats = [cache_format(p) for p in inputs]  # every input checked before the slow part
    timer = Timer()
    with Progress(total=len(inputs), desc="reading", unit="files", quiet=args.quiet) as bar:
        # the whole merge writes: its sorted runs, then the output (a stop ends either)
        figures = _stop.save(merge_cache_files, inputs, out, fmt, progress=_Sorting(bar), timer=_Stages(timer))
    summary = {"command": "merge", "inputs": inputs, "input_formats": formats, **figures,
               "output": out, "format": fmt, "file_bytes": os.path.getsize(out)}
    return finish(args, summary, timer)
