"""Stop strings over streamed text."""

from __future__ import annotations

__all__ = ["StopFilter"]


class StopFilter:
    """Holds back text that could be the start of a stop string; finds the first stop.
    ``text`` is every piece let through."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.text: list[str] = []
        self.stopped = False

    def feed(self, s: str) -> str:
        """The part of ``s`` that is safe to hand out now."""
        if self.stopped:
            return ""
        buf = self.pending + s
        cut = min((i for i in (buf.find(st) for st in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self.pending = ""
            out = buf[:cut]
        elif self.hold and len(buf) > self.hold:
            out, self.pending = buf[: -self.hold], buf[-self.hold :]
        elif self.hold:
            out, self.pending = "", buf
        else:
            out = buf
        self.text.append(out)
        return out

    def flush(self) -> str:
        """What was held back, at the end of the text (nothing after a stop)."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        self.text.append(out)
        return out
