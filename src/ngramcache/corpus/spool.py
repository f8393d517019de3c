"""Spool folders: the hidden working folders that sharded counting and streaming merges
keep beside their output, and their removal after a writer that could not clean up.

A spool can hold far more than the output (the sorted runs of every shard), so one left
behind by a killed writer (SIGKILL, the OOM killer, a power cut) must not stay for good.
Each spool is named ``.<output name>.runs-<host>-<pid>-<random>`` and holds a ``lock``
file on which its writer keeps an exclusive ``flock`` for as long as it works; the kernel
drops that lock when the process dies, however it dies. Before making its own spool, a
writer removes the spools in the same folder whose writer is gone:

* a spool of another host is never touched (its processes cannot be seen from here, and
  locks on network file systems are not to be trusted);
* a spool whose ``lock`` can be taken has no live writer;
* a spool without a ``lock`` (its writer died before taking it, or has not taken it yet)
  is removed only when no process has its pid.

The lock is taken on a file with another name and then renamed to ``lock``, so a ``lock``
file is never seen unlocked while its writer lives.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: the pid rule alone decides
    fcntl = None

__all__ = ["spool_folder", "remove_stale_spools"]

LOCK_NAME = "lock"
_SPOOL_NAME = re.compile(r"^\..*\.runs-(?P<host>.+)-(?P<pid>\d+)-(?P<token>[0-9a-f]{8})$")


def _host() -> str:
    # Only characters that are safe in a file name; '-' is kept (the pid and token are
    # found from the right).
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return True  # cannot tell: keep the spool
    return True


def _writer_gone(spool: Path, pid: int) -> tuple[bool, int | None]:
    """Whether the spool's writer is gone, and the descriptor holding its lock (taken so that
    no one else starts removing it too) when there is one."""
    if fcntl is not None:
        try:
            fd = os.open(spool / LOCK_NAME, os.O_RDONLY)
        except FileNotFoundError:
            fd = None
        except OSError:
            return False, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: the writer lives
                os.close(fd)
                return False, None
            return True, fd
    return not _pid_alive(pid), None


def remove_stale_spools(folder: str | os.PathLike) -> list[Path]:
    """Remove the spools in ``folder`` whose writers have died (see the module docstring);
    returns the ones removed. Never raises for a spool it cannot inspect or remove."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    host = _host()
    for entry in entries:
        m = _SPOOL_NAME.match(entry.name)
        if m is None or m["host"] != host or not entry.is_dir(follow_symlinks=False):
            continue
        spool = Path(entry.path)
        gone, fd = _writer_gone(spool, int(m["pid"]))
        try:
            if gone:
                shutil.rmtree(spool, ignore_errors=True)
                if not spool.exists():
                    removed.append(spool)
        finally:
            if fd is not None:
                os.close(fd)
    return removed


def _make_spool(folder: str, out_name: str) -> tuple[Path, int | None]:
    for _ in range(100):
        path = Path(folder) / f".{out_name}.runs-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(f"{folder}: cannot make a spool folder for {out_name}")
    if fcntl is None:
        return path, None
    staging = path / f"{LOCK_NAME}.{os.getpid()}"
    fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(staging, path / LOCK_NAME)
    except BaseException:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path, fd


@contextlib.contextmanager
def spool_folder(out: str | os.PathLike):
    """A new spool folder beside ``out``, removed on exit; spools of dead writers in that
    folder are removed first."""
    out = os.path.abspath(os.fspath(out))
    # Beside the output: the same disk that must hold the result anyway (a /tmp in RAM
    # would turn spooled runs back into memory).
    folder = os.path.dirname(out)
    remove_stale_spools(folder)
    path, fd = _make_spool(folder, os.path.basename(out))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if fd is not None:
            os.close(fd)
