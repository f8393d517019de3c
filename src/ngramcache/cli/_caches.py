"""What the cache commands (create, merge, convert, info) share: output formats, output
checks, writing either format, their figures and the summary they print."""

from __future__ import annotations

import os

from ngramcache.cli._common import RunError, UsageError, emit

FORMATS = ("ngst", "llama")
NGST_EXT = ".ngst"
LLAMA_EXTS = (".bin", ".lcs", ".lcd")


def add_format_flag(p, what: str = "OUT's extension") -> None:
    p.add_argument("--format", choices=FORMATS, help=f"output format (default: from {what})")


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


def write_cache(cache, path: str, fmt: str) -> None:
    """Write an NgramCache or a StaticTable in either format."""
    from ngramcache.static_table import StaticTable

    if fmt == "llama":
        if isinstance(cache, StaticTable):
            cache.to_llama(path)
        else:
            cache.save(path)
    else:
        table = cache if isinstance(cache, StaticTable) else cache_to_table(cache)
        table.save(path)


def cache_to_table(cache):
    """A StaticTable with the counts of an NgramCache (whose keys must share one size)."""
    from ngramcache.static_table import StaticTable

    keys = cache.arrays()[0]
    sizes = sorted({int(n) for n in (keys >= 0).sum(axis=1)}) if keys.shape[0] else [2]
    if len(sizes) > 1:
        raise RunError(f"a static table (.ngst) holds n-grams of one size, these counts have sizes "
                       f"{', '.join(map(str, sizes))} (a context or dynamic cache?): write a llama.cpp "
                       f".bin file instead")
    return StaticTable.from_cache(cache, ngram_size=sizes[0])


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


def table_figures(table) -> dict:
    return {"keys": len(table), "entries": int(table.n_entries), "total_count": int(table.total),
            "ngram_size": int(table.ngram_size)}


def counts(cache) -> dict:
    """keys, entries and total count of an NgramCache or a StaticTable (the summary's)."""
    from ngramcache.static_table import StaticTable

    f = table_figures(cache) if isinstance(cache, StaticTable) else cache_figures(cache)
    return {k: f[k] for k in ("keys", "entries", "total_count")}


def finish(args, summary: dict, timer=None, children: bool = False) -> int:
    """Print a cache command's summary (a table, or JSON with --json); exit status 0."""
    from ngramcache.progress import fmt_bytes, fmt_seconds, peak_rss_bytes

    if timer is not None:
        summary["seconds"] = round(timer.total, 4)
        if timer.stages:
            summary["stage_seconds"] = {k: round(v, 4) for k, v in timer.stages.items()}
    summary["peak_rss_bytes"] = peak_rss_bytes(include_children=children)
    rows = []
    for key, label in (("tokens", "tokens"), ("keys", "keys"), ("entries", "entries"), ("total_count", "total count")):
        if summary.get(key) is not None and summary[key] >= 0:
            rows.append((label, f"{summary[key]:,}"))
    if "output" in summary:
        rows.append(("output", f"{summary['output']} ({summary['format']}, {fmt_bytes(summary['file_bytes'])})"))
    if "seconds" in summary:
        t = fmt_seconds(summary["seconds"])
        if summary.get("stage_seconds"):
            t += " (" + ", ".join(f"{k} {fmt_seconds(v)}" for k, v in summary["stage_seconds"].items()) + ")"
        rows.append(("time", t))
    rows.append(("peak memory", fmt_bytes(summary["peak_rss_bytes"])))
    return emit(args, summary, title=f"{summary['command']}: done", rows=rows)
