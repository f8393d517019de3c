"""The benchmarks' token stream: the Python standard library's own source, tokenized by a
fixed scheme, so that every machine with the same Python version gets the same stream and
nothing has to be fetched or shipped:

- files: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, skipping
  ``site-packages`` and ``__pycache__``, in sorted order of their relative paths;
- text: the file's bytes decoded as UTF-8 (errors replaced), files concatenated;
- tokens: ``re.findall(r"\\w+|[^\\w\\s]|\\n", text)``: words, single punctuation
  characters and newlines (other whitespace dropped);
- ids: a dict in first-seen order (the first distinct token is 0, the next 1, ...);
- the first ``n`` tokens of that stream, cached as raw int32 in the temp folder.

Ids are assigned in first-seen order, so a shorter stream is a prefix of a longer one.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

TOKEN_RE = r"\w+|[^\w\s]|\n"


class StreamTooShort(ValueError):
    """The standard library on this machine has fewer tokens than were asked for."""


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py")
             if "site-packages" not in p.parts and "__pycache__" not in p.parts and p.is_file()]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def describe(tokens: np.ndarray) -> str:
    return (f"{tokens.size:,} tokens, {int(tokens.max()) + 1:,} distinct ids, Python "
            f"{sys.version_info.major}.{sys.version_info.minor} stdlib")


def stdlib_tokens(n: int) -> np.ndarray:
    """The first ``n`` tokens of the stream, int32 (StreamTooShort if there are fewer)."""
    # the cache file's name depends on everything that decides its contents
    tag = hashlib.sha256(f"{TOKEN_RE}|{n}|{sys.version_info[:2]}|{sysconfig.get_paths()['stdlib']}".encode()).hexdigest()[:16]
    cached = Path(tempfile.gettempdir()) / f"ngramcache-bench-stdlib-{tag}.i32"
    if cached.is_file() and cached.stat().st_size == 4 * n:
        return np.fromfile(cached, dtype="<i4").astype(np.int32)
    pattern = re.compile(TOKEN_RE)
    ids: dict[str, int] = {}
    out: list[int] = []
    for path in stdlib_files():
        text = path.read_bytes().decode("utf-8", errors="replace")
        out.extend(ids.setdefault(w, len(ids)) for w in pattern.findall(text))
        if len(out) >= n:
            break
    if len(out) < n:
        raise StreamTooShort(f"the standard library gave only {len(out):,} tokens, {n:,} were asked for")
    arr = np.asarray(out[:n], dtype="<i4")
    # written under a temporary name, then renamed: a concurrent run never reads half a file
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    arr.tofile(tmp)
    os.replace(tmp, cached)
    return arr.astype(np.int32)
