"""Progress bars with an ETA on stderr, and peak-memory figures, for the CLI commands.

    with Progress(total=n_bytes, desc="tokenizing", unit="B") as bar:
        for piece in pieces:
            ...
            bar.update(len(piece))

On a terminal the bar redraws in place (at most ten times a second). When stderr is not a
terminal (a log file, CI) it prints a plain line now and then instead (at most one every
few seconds, so short tasks print nothing), because a log full of carriage returns is
unreadable. ``quiet=True`` prints nothing at all.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import IO

__all__ = ["Progress", "peak_rss_bytes", "fmt_bytes", "fmt_count", "fmt_seconds"]


def _with_prefix(n: float, base: float, prefixes: tuple[str, ...], fmt) -> str:
    """n divided by base until it is below base, formatted by fmt(value, prefix)."""
    for prefix in prefixes[:-1]:
        n /= base
        if abs(n) < base:
            return fmt(n, prefix)
    return fmt(n / base, prefixes[-1])


def fmt_count(n: float) -> str:
    """1234567 -> '1.23M' (decimal prefixes; plain integers below 10,000)."""
    n = float(n)
    if abs(n) < 10_000:
        return f"{n:.0f}"
    return _with_prefix(n, 1000.0, ("k", "M", "G", "T", "P"),
                        lambda v, p: f"{v:.3g}{p}" if abs(v) < 100 else f"{v:.0f}{p}")


def fmt_bytes(n: float) -> str:
    """Binary prefixes, as memory and file sizes are usually read: 1536 -> '1.5 KiB'."""
    n = float(n)
    if abs(n) < 1024:
        return f"{n:.0f} B"
    return _with_prefix(n, 1024.0, ("KiB", "MiB", "GiB", "TiB", "PiB"), lambda v, p: f"{v:.1f} {p}")


def fmt_seconds(s: float) -> str:
    """Seconds as '0.42 s', '12.3 s', '3:05' or '1:02:03'."""
    if s != s or s == float("inf"):  # NaN or unknown
        return "?"
    if s < 10:
        return f"{s:.2f} s"
    if s < 60:
        return f"{s:.1f} s"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def peak_rss_bytes(include_children: bool = False) -> int:
    """Peak resident memory of this process so far, in bytes.

    With ``include_children``, the larger of this process's peak and that of its largest
    finished child (worker processes, e.g. parallel tokenizers); the kernel keeps only the
    maximum over children, not their sum.
    """
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    if include_children:
        peak = max(peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale)
    return int(peak)


def _fmt_amount(n: float, unit: str) -> str:
    if unit == "B":
        return fmt_bytes(n)
    return f"{fmt_count(n)} {unit}" if unit else fmt_count(n)


class Progress:
    """A progress bar for ``total`` units of work (``None`` if unknown: no percentage, no ETA).

    ``update(n)`` records n more units done; ``close()`` (or leaving the ``with`` block)
    finishes the line. Thread-unsafe by design: update it from one thread.
    """

    TTY_INTERVAL = 0.1  # seconds between redraws on a terminal
    LOG_INTERVAL = 5.0  # seconds between lines when stderr is not a terminal
    WIDTH = 24  # characters in the bar itself

    def __init__(self, total: float | None, desc: str, unit: str = "tok", quiet: bool = False,
                 stream: IO[str] | None = None):
        if total is not None and total < 0:
            raise ValueError(f"Progress total must be >= 0 or None, got {total}")
        self.total = total
        self.desc = desc
        self.unit = unit
        self.quiet = quiet
        self.n = 0.0
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self._last = self.start
        self._printed = False
        self._closed = False
        try:
            self.tty = bool(self.stream.isatty()) and os.environ.get("TERM") != "dumb"
        except (AttributeError, ValueError):
            self.tty = False

    # -- public API -------------------------------------------------------------------
    def update(self, n: float = 1) -> None:
        self.n += n
        if self.quiet or self._closed:
            return
        now = time.perf_counter()
        interval = self.TTY_INTERVAL if self.tty else self.LOG_INTERVAL
        if now - self._last >= interval:
            self._last = now
            self._draw(now, final=False)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.quiet:
            return
        # A terminal always gets the finished bar; a log gets a closing line only if it
        # already showed this task's progress (short tasks stay silent there).
        if self.tty or self._printed:
            self._draw(time.perf_counter(), final=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self.tty and self._printed and not self.quiet:
            # Leave the partial bar visible, and the error message on its own line.
            self._closed = True
            self.stream.write("\n")
            self.stream.flush()
            return
        self.close()

    # -- drawing ----------------------------------------------------------------------
    def line(self, now: float | None = None) -> str:
        """The current status as one line of text (without the bar's carriage return)."""
        now = time.perf_counter() if now is None else now
        elapsed = max(now - self.start, 1e-9)
        rate = self.n / elapsed
        done = _fmt_amount(self.n, self.unit)
        speed = f"{_fmt_amount(rate, self.unit)}/s"
        if self.total:
            frac = min(self.n / self.total, 1.0)
            filled = int(frac * self.WIDTH)
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            remaining = (self.total - self.n) / rate if rate > 0 else float("inf")
            eta = "done" if frac >= 1.0 else f"ETA {fmt_seconds(max(remaining, 0.0))}"
            return (f"{self.desc}: {frac * 100:3.0f}% [{bar}] {done} / {_fmt_amount(self.total, self.unit)}"
                    f"  {speed}  {fmt_seconds(elapsed)}  {eta}")
        return f"{self.desc}: {done}  {speed}  {fmt_seconds(elapsed)}"

    def _draw(self, now: float, final: bool) -> None:
        text = self.line(now)
        try:
            if self.tty:
                # \x1b[K clears what a longer previous line left behind.
                self.stream.write("\r" + text + "\x1b[K" + ("\n" if final else ""))
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            # A closed or broken stderr must not fail the work being reported on.
            self.quiet = True
        self._printed = True
