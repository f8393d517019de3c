"""Worker processes that leave Ctrl-C to the process that started them.

A Ctrl-C in a terminal goes to its whole process group: a local Dask cluster's workers as
well as the command. The command is the one to act on it (it closes the cluster in order);
a Dask worker that took it too would print a KeyboardInterrupt traceback of its own."""

from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def children_ignore_sigint():
    """Processes started inside ignore SIGINT: they inherit SIG_IGN, and a Python that starts
    with SIGINT ignored installs no KeyboardInterrupt handler. A Ctrl-C meanwhile is lost
    (starting workers takes a few seconds at most)."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: the signal handlers are not ours to change
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def ignore_sigint() -> None:
    """For a worker process to call at its start."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the process's main thread: leave its signals alone
        pass


def dask_setup(worker) -> None:
    """Dask's preload hook (``preload=["ngramcache.corpus._workers"]``): also covers a worker
    that its nanny restarts after the cluster started."""
    ignore_sigint()
