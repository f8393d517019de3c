"""``ngramcache info``: what a cache file holds."""

from __future__ import annotations

import os

from ngramcache.cli._caches import cache_figures, table_figures
from ngramcache.cli._common import Timer, add_output_flags, command_parser, emit
from ngramcache.progress import fmt_bytes, fmt_seconds, peak_rss_bytes

DESCRIPTION = """\
Describe a cache file. For an ngramcache static table (.ngst): its header (read alone,
without mapping the rest) and section sizes; --verify also checks every section's checksum.
For a llama.cpp lookup.bin (which has no header): the file is read whole and checked, then
its records (keys), (key, token) pairs, total and largest counts and keys per n-gram size
are printed."""


def add_parser(sub) -> None:
    p = command_parser(sub, "info", run, help="print a cache file's header and sizes", description=DESCRIPTION)
    p.add_argument("file", metavar="FILE", help="cache file (.ngst or llama.cpp lookup.bin)")
    p.add_argument("--verify", action="store_true",
                   help="static tables: check every section's checksum (reads the whole file)")
    add_output_flags(p)


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    return v


def _header_rows(header: dict, prefix: str = "header") -> list[tuple[str, str]]:
    rows = []
    for k, v in header.items():
        name = f"{prefix}.{k}"
        if isinstance(v, dict):
            rows += _header_rows(v, name)
        elif isinstance(v, bool) or v is None:
            rows.append((name, str(v)))
        elif isinstance(v, int):
            rows.append((name, f"0x{v:016x}" if "checksum" in prefix else f"{v:,}"))
        elif isinstance(v, (list, tuple)) and len(v) == 2 and "section" in prefix:
            rows.append((name, f"offset {v[0]:,}, {v[1]:,} bytes"))
        else:
            rows.append((name, str(v)))
    return rows


def run(args) -> int:
    from ngramcache.files import cache_format, open_cache
    from ngramcache.static_table import StaticTable

    fmt = cache_format(args.file)
    timer = Timer()
    out: dict = {"command": "info", "file": args.file, "format": fmt, "file_bytes": os.path.getsize(args.file)}
    if fmt == "llama":
        with timer.stage("read"):
            cache = open_cache(args.file)
        f = cache_figures(cache)
        out.update(records=f["keys"], pairs=f["entries"], total_count=f["total_count"], max_count=f["max_count"],
                   max_tokens_per_record=f["max_entries_per_key"], records_by_ngram_size=f["keys_by_ngram_size"],
                   memory_bytes=int(cache.nbytes))
        if args.verify:
            out["verified"] = True  # reading it whole is the only check a headerless file allows
    else:
        with timer.stage("read header"):
            out["header"] = _jsonable(StaticTable.read_header(args.file))
        with timer.stage("open"):
            table = open_cache(args.file)
        out.update(table_figures(table))
        out["nbytes"] = int(table.nbytes)
        if args.verify:
            with timer.stage("verify"):
                table.verify()
            out["verified"] = True
    out["seconds"] = round(timer.total, 4)
    out["peak_rss_bytes"] = peak_rss_bytes()
    if fmt == "llama":
        rows = [("records (keys)", f"{out['records']:,}"), ("pairs (key, token)", f"{out['pairs']:,}"),
                ("total count", f"{out['total_count']:,}"), ("largest count", f"{out['max_count']:,}"),
                ("most tokens in a record", f"{out['max_tokens_per_record']:,}"),
                ("records by n-gram size", ", ".join(f"{k}: {v:,}" for k, v in out["records_by_ngram_size"].items())
                 or "-"),
                ("memory once loaded", fmt_bytes(out["memory_bytes"]))]
    else:
        rows = _header_rows(out["header"]) + [
            ("keys", f"{out['keys']:,}"), ("total count", f"{out['total_count']:,}"),
            ("entries", f"{out['entries']:,}"), ("mapped bytes", f"{out['nbytes']:,}")]
    if args.verify:
        rows.append(("verified", "yes"))
    rows.append(("time", fmt_seconds(out["seconds"])))
    kind = "ngramcache static table" if fmt == "ngst" else "llama.cpp lookup.bin"
    return emit(args, out, title=f"{args.file}: {kind}, {out['file_bytes']:,} bytes ({fmt_bytes(out['file_bytes'])})",
                rows=rows)
