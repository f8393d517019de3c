"""Ctrl-C and SIGTERM in the commands that write a file, so that what a command reports is
what happened to its output (docs/cli.md, "Interrupting a command"):

* before the output is written, a signal stops the command at once: "interrupted" (130)
  or "terminated" (143), the output untouched;
* while it is written (:func:`save`: the save runs on a thread, this one waits), a signal
  stops the save before its rename (``_core.stop_saves``): the command ends "interrupted",
  the previous output byte for byte as it was and no temporary file left, unless the
  rename had already happened;
* once the output is in place, a signal changes nothing: the command reports it done.

SIGTERM is raised as :class:`Terminated`, a ``KeyboardInterrupt``, so that it unwinds as
Ctrl-C does: every ``finally`` runs (a spool folder removed, a local Dask cluster closed
and its semaphores released) rather than the process vanishing mid-work.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

__all__ = ["Terminated", "install", "save", "pause_point", "PAUSE_ENV"]

#: a test's way to hold a command at a named point (see :func:`pause_point`)
PAUSE_ENV = "NGRAMCACHE_PAUSE_AT"


class Terminated(KeyboardInterrupt):
    """The command got SIGTERM."""


class _State:
    phase = "work"  # "work", "saving" (the output is being written), "saved" (it is in place)
    pending: int | None = None  # the signal that came while saving or saved


def _handler(sig, frame) -> None:
    if _State.phase == "work":
        raise Terminated() if sig == signal.SIGTERM else KeyboardInterrupt()
    if _State.pending is None:
        _State.pending = sig
    if _State.phase == "saving":
        from ngramcache import _core

        _core.stop_saves()


def install() -> None:
    """Take SIGTERM, and SIGINT where it is not ignored (a command started in the
    background keeps ignoring it), for the rest of the process: called by ``main``."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _handler)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _handler)


def _interrupt(sig: int) -> KeyboardInterrupt:
    return Terminated() if sig == signal.SIGTERM else KeyboardInterrupt()


def save(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, which writes the command's output, on a thread that a
    signal stops before it replaces the output (see the module's docstring). Returns
    what ``fn`` returned; raises its error, or the interrupt when the save was stopped."""
    from ngramcache import _core

    outcome: dict = {}

    def work():
        try:
            outcome["result"] = fn(*args, **kwargs)
        except BaseException as e:  # passed to the waiting thread
            outcome["error"] = e

    _State.phase = "saving"
    thread = threading.Thread(target=work, name="ngramcache-save", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.05)  # short waits: the signal handlers run on this thread
    error = outcome.get("error")
    if error is None:
        _State.phase = "saved"  # from here on the output is the new one, whatever comes
        _core.resume_saves()  # a stop that came after the rename stopped nothing
        pause_point("renamed")
        return outcome["result"]
    _State.phase = "work"
    _core.resume_saves()
    sig, _State.pending = _State.pending, None
    if sig is not None:
        raise _interrupt(sig) from None
    raise error


def pause_point(name: str) -> None:
    """Hold here while ``$NGRAMCACHE_PAUSE_AT`` names this point, until a signal comes (at
    most 60 s), telling stderr "paused at NAME": how the tests put a signal at a known
    point of a command (counting, sorting, writing, after the rename)."""
    if os.environ.get(PAUSE_ENV) != name:
        return
    print(f"ngramcache: paused at {name}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + 60
    while _State.pending is None and time.monotonic() < deadline:
        time.sleep(0.02)  # in the "work" phase the handler raises from here
