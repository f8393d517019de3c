"""Files: one way to open a cache file of either format, token files, the inputs of a
command (files and directories), and atomic writes (``atomic_open``, a thin wrapper of the
C++ core's ``AtomicFile``, which the core's own saves use too: one set of saving rules,
docs/architecture.md, "Saving files").

A cache file is an ngramcache static table (NGST, recognised by its magic) or a
llama.cpp ``lookup.bin`` (no header: anything else is read as one).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Iterable

import numpy as np

from ngramcache import _core
from ngramcache._validate import as_tokens

__all__ = ["NGST_MAGIC", "atomic_open", "cache_format", "open_cache", "load_counts", "expand_inputs",
           "read_tokens_file", "write_tokens_file", "check_regular_file"]

# The first bytes of an ngramcache static table (docs/format.md). A llama.cpp lookup.bin
# has no header: it starts with a token id, whose bytes never spell "NGST" for a real
# vocabulary (that would be id 1,414,743,886).
NGST_MAGIC = b"NGST"
NGST_EXT = ".ngst"


# ----------------------------------------------------------------------------------------
# Input files
# ----------------------------------------------------------------------------------------

_KINDS = ((stat.S_ISFIFO, "a pipe (FIFO)"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def check_regular_file(path: str | os.PathLike, what: str = "file") -> None:
    """Refuse at once, naming ``path``, an input that is not a regular file (symbolic
    links followed): ``FileNotFoundError`` (a dangling link says where it points),
    ``IsADirectoryError``, or ``ValueError`` for a pipe, device or socket. Opening a pipe
    waits for a writer and a device can be read forever; every input of this package is
    read with its size known, so each of them must be a file. ``what`` names it in the
    message (a "token file", "cache file")."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise FileNotFoundError(2, f"a symbolic link to {os.readlink(path)}, which does not exist",
                                    path) from None
        raise
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, f"is a directory, not a {what}", path)
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
    raise ValueError(f"{path}: is {kind}, not a regular {what}: inputs are read with their size known, so save it to "
                     f"a file first")


# ----------------------------------------------------------------------------------------
# Cache files
# ----------------------------------------------------------------------------------------

def cache_format(path: str | os.PathLike) -> str:
    """``"ngst"`` for an ngramcache static table (by its magic; an empty ``.ngst`` file
    too, so that opening it says what is wrong with it), else ``"llama"``. A path that is
    not a regular file is refused (``check_regular_file``)."""
    path = os.fspath(path)
    check_regular_file(path, "cache file")
    with open(path, "rb") as f:  # FileNotFoundError names the path
        magic = f.read(len(NGST_MAGIC))
    if magic == NGST_MAGIC or (not magic and os.path.splitext(path)[1].lower() == NGST_EXT):
        return "ngst"
    return "llama"


def open_cache(path: str | os.PathLike):
    """Open a cache file of either format for drafting: a ``StaticTable`` (memory-mapped,
    O(1)) for an NGST file, an ``NgramCache`` (read whole) for a llama.cpp lookup.bin.
    Raises CacheFormatError naming the file and the problem for a damaged one."""
    from ngramcache.cache import NgramCache
    from ngramcache.static_table import StaticTable

    if cache_format(path) == "ngst":
        return StaticTable.open(path)
    return NgramCache.load(path)


def load_counts(path: str | os.PathLike):
    """The counts of a cache file of either format as a new, mutable ``NgramCache``
    (for merging and rewriting)."""
    from ngramcache.static_table import StaticTable

    cache = open_cache(path)
    return cache.to_cache() if isinstance(cache, StaticTable) else cache


# ----------------------------------------------------------------------------------------
# Inputs: files and directories
# ----------------------------------------------------------------------------------------

def _is_binary(path: Path) -> bool:
    with open(path, "rb") as f:
        return b"\0" in f.read(8192)


def expand_inputs(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[Path]]:
    """Files to read, in order: a file as given; a directory as every regular file under it
    (recursively, sorted by path, hidden entries and ``__pycache__`` left out). Returns
    (files, skipped) where skipped lists directory entries that look binary (a NUL byte in
    their first 8 KiB). Raises FileNotFoundError for a path that does not exist."""
    files: list[Path] = []
    skipped: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = []
            for root, dirs, names in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                for nm in names:
                    if not nm.startswith("."):
                        fp = Path(root) / nm
                        if fp.is_file():
                            found.append(fp)
            for fp in sorted(found, key=lambda x: x.relative_to(p).parts):
                (skipped if _is_binary(fp) else files).append(fp)
        elif p.exists() or p.is_symlink():
            check_regular_file(p, "file or directory")
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or directory")
    return files, skipped


# ----------------------------------------------------------------------------------------
# Token files
# ----------------------------------------------------------------------------------------

_NPY_MAGIC = b"\x93NUMPY"


def read_tokens_file(path: str | os.PathLike) -> np.ndarray:
    """Read token ids from a ``.npy`` file (any 1-D integer array) or a raw file of
    little-endian int32 (no header; the count is the size / 4). Rejects a raw file whose
    size is not a multiple of 4, negative ids, and ids beyond int32."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a directory, not a token file")
    check_regular_file(path, "token file")
    with open(path, "rb") as f:
        head = f.read(len(_NPY_MAGIC))
    if head == _NPY_MAGIC:
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as e:  # numpy's header parser also raises tokenize errors, SyntaxError ...
            raise ValueError(f"{path}: not a readable .npy file ({type(e).__name__}: {e})") from None
        if arr.dtype.kind not in "iu":
            raise ValueError(f"{path}: token ids must be integers, the .npy holds dtype {arr.dtype}")
        return as_tokens(arr, path)
    size = os.path.getsize(path)
    if size % 4:
        raise ValueError(f"{path}: {size} bytes is not a whole number of int32 token ids "
                         f"(raw token files are little-endian int32, 4 bytes each, no header)")
    arr = np.fromfile(path, dtype="<i4")
    if arr.size and arr.min() < 0:
        i = int(np.argmax(arr < 0))
        raise ValueError(f"{path}: negative token id {int(arr[i])} at index {i} "
                         f"(is this really a raw little-endian int32 token file?)")
    return np.ascontiguousarray(arr.astype(np.int32, copy=False))


def write_tokens_file(path: str | os.PathLike, tokens) -> None:
    """Write tokens as raw little-endian int32, atomically (temp file, fsync, rename)."""
    arr = as_tokens(tokens).astype("<i4", copy=False)
    with atomic_open(path) as f:
        arr.tofile(f)


# ----------------------------------------------------------------------------------------
# Atomic writes
# ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None):
    """Open a new file that replaces ``path`` on a clean exit, the way every file of this
    package is saved: a temporary file beside ``path`` (anonymous where the file system
    allows), fsynced and renamed over ``path``, then the folder fsynced. On an exception the
    temporary file is removed and ``path`` is left as it was. A replaced file keeps its mode
    (and owner and group where permitted), a new one gets 0666 less the umask; a symbolic
    link is followed and kept. ``mode`` is ``"w"``, ``"wb"``, ``"w+"`` or ``"wb+"``.
    Errors are OSErrors naming ``path``; a NUL byte in it is a ValueError."""
    if mode.replace("b", "").replace("t", "") not in ("w", "w+"):
        raise ValueError(f"atomic_open writes a whole new file: mode must be 'w', 'wb', 'w+' or 'wb+', not {mode!r}")
    save = _core.AtomicFile(os.fsencode(path))
    try:
        # The core owns the descriptor: it closes it on commit or abort.
        with os.fdopen(save.fd, mode, encoding=encoding, closefd=False) as f:
            yield f
            f.flush()
    except BaseException:
        save.abort()
        raise
    save.commit()
