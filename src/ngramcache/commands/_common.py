"""Shared pieces of the cache commands (create, merge, convert, info): error handling and
exit codes, file formats, summaries."""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
from typing import Callable

from ..progress import fmt_bytes, fmt_seconds, peak_rss_bytes

FORMATS = ("ngst", "llama")
NGST_EXT = ".ngst"
LLAMA_EXTS = (".bin", ".lcs", ".lcd")


class UsageError(Exception):
    """Bad flags or arguments: exit code 2."""


class RunError(Exception):
    """A runtime failure already phrased for the user: exit code 1."""


def add_output_flags(p) -> None:
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars or notes on stderr")


def guarded(command: str) -> Callable:
    """Turn exceptions into a one-line message on stderr and the exit code:
    2 for usage errors, 1 for runtime failures (missing or damaged files, bad text...)."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(args) -> int:
            prefix = f"ngramcache {command}: error: "
            try:
                return int(fn(args) or 0)
            except UsageError as e:
                parser = getattr(args, "_parser", None)
                if parser is not None:
                    parser.print_usage(sys.stderr)
                print(prefix + str(e), file=sys.stderr)
                return 2
            except BrokenPipeError:
                # stdout closed early (e.g. piped into head): nothing left to tell anyone.
                try:
                    sys.stdout = open(os.devnull, "w")
                except OSError:
                    pass
                return 1
            except FileNotFoundError as e:
                print(prefix + _describe_oserror(e, "no such file or directory"), file=sys.stderr)
                return 1
            except (RunError, ValueError, ImportError) as e:
                from .. import CacheFormatError
                kind = "damaged or not a cache file: " if isinstance(e, CacheFormatError) else ""
                print(prefix + kind + str(e), file=sys.stderr)
                return 1
            except OSError as e:
                print(prefix + _describe_oserror(e, e.strerror or "I/O error"), file=sys.stderr)
                return 1
            except MemoryError:
                print(prefix + "out of memory", file=sys.stderr)
                return 1

        return run

    return wrap


def _describe_oserror(e: OSError, what: str) -> str:
    # Our own messages already name the file; the OS's name it in e.filename.
    if e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return str(e) if str(e) else what


# -- formats ------------------------------------------------------------------------------

def static_table_class():
    try:
        from .. import StaticTable
    except ImportError:
        raise RunError("this build of ngramcache has no StaticTable (the .ngst format); "
                       "use --format llama") from None
    return StaticTable


def output_format(path: str, fmt: str | None) -> str:
    """--format wins; else the extension: .ngst -> ngst, .bin/.lcs/.lcd -> llama."""
    if fmt:
        return fmt
    ext = os.path.splitext(path)[1].lower()
    if ext == NGST_EXT:
        return "ngst"
    if ext in LLAMA_EXTS:
        return "llama"
    raise UsageError(f"{path}: cannot tell the output format from the extension {ext or '(none)'!r}; "
                     f"use a {NGST_EXT} or .bin name, or --format ngst|llama")


NGST_MAGIC = b"NGST"


def input_format(path: str) -> str:
    """What an existing cache file is: 'ngst' if it starts with the static table's magic,
    else 'llama' (llama.cpp's lookup.bin has no header to recognise it by; a first key
    token that spells "NGST" would be id 1,414,743,886, beyond any vocabulary)."""
    if os.path.isdir(path):
        raise RunError(f"{path}: is a directory, not a cache file")
    with open(path, "rb") as f:  # FileNotFoundError names the path
        magic = f.read(len(NGST_MAGIC))
    if magic == NGST_MAGIC or (not magic and os.path.splitext(path)[1].lower() == NGST_EXT):
        return "ngst"
    return "llama"


def check_output_path(out: str, inputs: list[str]) -> None:
    """Fail before the work, not after it, for an output that cannot be written."""
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise RunError(f"{out}: the directory {parent} does not exist")
    if os.path.isdir(out):
        raise RunError(f"{out}: is a directory")
    for i in inputs:
        try:
            if os.path.exists(i) and os.path.exists(out) and os.path.samefile(i, out):
                raise UsageError(f"{out}: the output would overwrite the input {i}")
        except OSError:
            pass


def load_cache(path: str, fmt: str):
    """An NgramCache holding the counts of a cache file of either format."""
    from ..cache import NgramCache
    if fmt == "llama":
        return NgramCache.load(path)
    table = static_table_class().open(path)
    return table_to_cache(table)


def table_to_cache(table):
    from ..cache import NgramCache
    if hasattr(table, "to_cache"):
        return table.to_cache()
    with tempfile.TemporaryDirectory(prefix="ngramcache-") as d:
        tmp = os.path.join(d, "table.bin")
        table.to_llama(tmp)
        return NgramCache.load(tmp)


def cache_to_table(cache, out_dir: str | None = None):
    """A StaticTable with the counts of an NgramCache (whose keys must share one size)."""
    StaticTable = static_table_class()
    keys = cache.arrays()[0]
    sizes = sorted({int(n) for n in (keys >= 0).sum(axis=1)}) if keys.shape[0] else [2]
    if len(sizes) > 1:
        raise RunError(f"a static table (.ngst) holds n-grams of one size, these counts have sizes "
                       f"{', '.join(map(str, sizes))} (a context or dynamic cache?): write a llama.cpp "
                       f".bin file instead")
    if hasattr(StaticTable, "from_cache"):
        return StaticTable.from_cache(cache, ngram_size=sizes[0])
    with tempfile.TemporaryDirectory(prefix="ngramcache-", dir=out_dir) as d:
        tmp = os.path.join(d, "cache.bin")
        cache.save(tmp)
        return StaticTable.from_llama(tmp)


def cache_figures(cache) -> dict:
    """keys, entries, total count and keys per n-gram size of an NgramCache."""
    keys, offsets, toks, cnts = cache.arrays()
    sizes = (keys >= 0).sum(axis=1) if keys.size else keys[:, 0]
    return {
        "keys": int(keys.shape[0]),
        "entries": int(toks.size),
        "total_count": int(cnts.sum(dtype="int64")) if cnts.size else 0,
        "max_count": int(cnts.max()) if cnts.size else 0,
        "max_entries_per_key": int((offsets[1:] - offsets[:-1]).max()) if keys.shape[0] else 0,
        "keys_by_ngram_size": {str(n): int((sizes == n).sum()) for n in range(1, 5) if (sizes == n).any()},
    }


def _first(d: dict, *names, default=None):
    for n in names:
        if n in d:
            return d[n]
    return default


def table_figures(table) -> dict:
    info = {}
    try:
        info = dict(table.info())
    except Exception:
        pass
    entries = getattr(table, "n_entries", None)
    if entries is None:
        entries = _first(info, "n_entries", "entries", default=-1)
    return {
        "keys": int(len(table)),
        "entries": int(entries),
        "total_count": int(table.total),
        "ngram_size": int(table.ngram_size),
    }


# -- summaries ----------------------------------------------------------------------------

class Timer:
    """Wall-clock seconds per stage, in the order the stages ran."""

    def __init__(self):
        self.start = time.perf_counter()
        self.stages: dict[str, float] = {}

    def stage(self, name: str):
        timer = self

        class _Stage:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                timer.stages[name] = timer.stages.get(name, 0.0) + time.perf_counter() - self.t

        return _Stage()

    @property
    def total(self) -> float:
        return time.perf_counter() - self.start


def finish(args, summary: dict, timer: Timer | None = None, children: bool = False) -> int:
    """Print the summary (a table, or JSON with --json) on stdout; return exit code 0."""
    if timer is not None:
        summary["seconds"] = round(timer.total, 4)
        if timer.stages:
            summary["stage_seconds"] = {k: round(v, 4) for k, v in timer.stages.items()}
    summary["peak_rss_bytes"] = peak_rss_bytes(include_children=children)
    if getattr(args, "json", False):
        print(json.dumps(summary, sort_keys=False))
        return 0
    rows = []
    labels = [("tokens", "tokens"), ("keys", "keys"), ("entries", "entries"), ("total_count", "total count")]
    for key, label in labels:
        if key in summary and summary[key] is not None and summary[key] >= 0:
            rows.append((label, f"{summary[key]:,}"))
    if "output" in summary:
        rows.append(("output", f"{summary['output']} ({summary['format']}, {fmt_bytes(summary['file_bytes'])})"))
    if "seconds" in summary:
        t = fmt_seconds(summary["seconds"])
        if summary.get("stage_seconds"):
            t += " (" + ", ".join(f"{k} {fmt_seconds(v)}" for k, v in summary["stage_seconds"].items()) + ")"
        rows.append(("time", t))
    rows.append(("peak memory", fmt_bytes(summary["peak_rss_bytes"])))
    width = max(len(r[0]) for r in rows)
    print(f"{summary['command']}: done")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    return 0


def note(args, msg: str) -> None:
    if not getattr(args, "quiet", False):
        print(msg, file=sys.stderr)
