"""Connections that cost the server nothing when clients misbehave: the HTTP protocol of
uvicorn with a bound on connections and on the time a request head may take, the open
file limit raised to fit, and the event loop's accept errors told once a minute rather
than once each (docs/serve.md, "Limits").

A connection *waits for a head* from the moment it opens, and again after each answer
(keep-alive), until its next request head has arrived whole. One that waits longer than
``header_timeout`` seconds is closed (a client sending a header a byte at a time holds
nothing for long). At ``max_connections`` open connections, a new one makes room by
closing the one that has waited for a head the longest; when every connection is busy
with a request, the new one is answered 503 and closed. Idle clients can thus never keep
a request, or ``/health``, out.
"""

from __future__ import annotations

import logging
import time

from ngramcache.serving.errors import UnavailableError
from ngramcache.serving.http_errors import error_json

__all__ = ["guarded_protocol", "raise_open_files_limit", "quiet_accept_errors", "FILES_PER_SERVER"]

#: descriptors the server needs besides its connections (model, memory, logs, loop)
FILES_PER_SERVER = 64


def _busy_response() -> bytes:
    body = error_json(UnavailableError("the server has as many connections as it takes (serve --max-connections), "
                                       "all of them busy; try again later", code="too_many_connections"))
    head = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


def guarded_protocol(base: type, *, max_connections: int, header_timeout: float) -> type:
    """uvicorn's HTTP protocol class ``base`` with the bounds of the module's docstring."""

    class Guarded(base):
        def connection_made(self, transport):
            super().connection_made(transport)
            self._head_of = self.cycle  # the request whose head was seen last
            self._waiting_since: float | None = None
            self._timer = None
            self._wait_for_head()
            if len(self.connections) > max_connections:
                self._make_room()

        def _close(self):
            self._waiting_since = None  # not idle any more: not chosen twice to make room
            self.transport.close()

        def _wait_for_head(self):
            self._waiting_since = time.monotonic()
            self._timer = self.loop.call_later(header_timeout, self._head_too_slow)

        def _head_arrived(self):
            self._head_of = self.cycle
            self._waiting_since = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _head_too_slow(self):
            self._timer = None
            if self._waiting_since is not None and not self.transport.is_closing():
                self._close()

        def _make_room(self):
            # the connections closed a moment ago are still in the set until the loop has
            # dropped them: they count for nothing
            live = [c for c in self.connections if c is not self and not c.transport.is_closing()]
            if len(live) < max_connections:
                return
            idle = [c for c in live if getattr(c, "_waiting_since", None) is not None]
            if idle:
                min(idle, key=lambda c: c._waiting_since)._close()
            else:
                self.transport.write(_busy_response())
                self._close()

        def data_received(self, data):
            super().data_received(data)
            if self.cycle is not self._head_of:
                self._head_arrived()

        def on_response_complete(self):
            super().on_response_complete()
            # a pipelined request may have been read already; else wait for the next head
            if self.cycle is not self._head_of:
                self._head_arrived()
            elif not self.transport.is_closing() and self._timer is None:
                self._wait_for_head()

        def connection_lost(self, exc):
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._waiting_since = None
            super().connection_lost(exc)

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def raise_open_files_limit(wanted: int) -> int:
    """Raise this process's soft limit on open files towards ``wanted`` (never past the
    hard limit, never lower than it is); returns the limit now in force."""
    try:
        import resource
    except ImportError:  # not POSIX
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return wanted if soft == resource.RLIM_INFINITY else soft


ACCEPT_ERROR = "socket.accept() out of system resource"


def quiet_accept_errors(loop, log: logging.Logger, every: float = 60.0) -> None:
    """Make ``loop`` tell its accept errors (too many open files: the loop retries each
    second, or at once for each pending connection) once every ``every`` seconds, with a
    count, instead of once each with a traceback; other errors as before."""
    state = {"last": None, "count": 0}
    previous = loop.get_exception_handler()

    def handler(loop, context):
        if context.get("message") != ACCEPT_ERROR:
            if previous is not None:
                return previous(loop, context)
            return loop.default_exception_handler(context)
        state["count"] += 1
        now = time.monotonic()
        if state["last"] is None or now - state["last"] >= every:
            exc = context.get("exception")
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            log.error("cannot accept connections: %s (accept errors since the last report: %d; see serve "
                      "--max-connections)", why, state["count"])
            state["last"], state["count"] = now, 0

    loop.set_exception_handler(handler)
