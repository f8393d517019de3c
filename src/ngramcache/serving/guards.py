"""Who may use the server, and how long a client may take to send its request: ASGI
middleware in front of the application (docs/serve.md, "Security").

* :class:`Gate`: a ``Host`` header outside the allow-list is refused (a page on another
  site that rebinds its DNS name to 127.0.0.1 sends its own name), then a request without
  the API key (``Authorization: Bearer KEY``, as OpenAI's clients send it) is refused
  with 401, on every route but ``/health`` and the chat page's static files.
* :class:`BodyTimeout`: a request body that has not arrived whole within a bound is
  answered 408 (a client that sends one byte a minute holds a connection for nothing).

Every refusal is OpenAI's error body, as for any other error of the server.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import time
from typing import Iterable

from ngramcache.serving.errors import EngineError, RequestError
from ngramcache.serving.http_errors import error_json

__all__ = ["Gate", "BodyTimeout", "default_allowed_hosts", "is_loopback", "OPEN_PATHS"]

#: what answers without the key: the health check, and the chat page and its icon (static
#: files that carry no data; the page asks for the key before it calls the API)
OPEN_PATHS = frozenset({"/health", "/", "/favicon.ico"})

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host.strip("[]").lower() in LOCAL_NAMES or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(bound: str) -> tuple[str, ...] | None:
    """The ``Host`` names a server bound to ``bound`` answers by default: that address and
    this machine's local names; None (any) for a wildcard address (0.0.0.0, ::), whose
    names cannot be known here."""
    if bound.strip("[]") in ("0.0.0.0", "::", ""):
        return None
    return tuple(dict.fromkeys([bound.strip("[]").lower(), *LOCAL_NAMES]))


def _host_name(value: bytes) -> str:
    # "name:port", "[v6]:port", "v4", "[v6]": the name alone, lower case
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


async def _send_error(send, e: EngineError, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    body = error_json(e)
    await send({"type": "http.response.start", "status": e.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class Gate:
    """ASGI middleware: the ``Host`` allow-list (``allowed_hosts``; None: any host), then
    the API key (``api_key``; None: no key) on every path but :data:`OPEN_PATHS`."""

    def __init__(self, app, api_key: str | None = None, allowed_hosts: Iterable[str] | None = None):
        self.app = app
        self.key = None if api_key is None else api_key.encode()
        self.hosts = None if allowed_hosts is None else frozenset(h.strip("[]").lower() for h in allowed_hosts)

    def _host_refusal(self, headers) -> EngineError | None:
        if self.hosts is None:
            return None
        for k, v in headers:
            if k == b"host":
                name = _host_name(v)
                if name in self.hosts:
                    return None
                shown = name.encode("ascii", "backslashreplace").decode()[:100]
                return RequestError(f"the Host header {shown!r} is not one this server answers to (serve "
                                    f"--allowed-host)", status=421, code="invalid_host")
        return RequestError("the request has no Host header", status=421, code="invalid_host")

    def _key_refusal(self, scope) -> EngineError | None:
        if self.key is None or scope["path"] in OPEN_PATHS:
            return None
        given = None
        for k, v in scope.get("headers", ()):
            if k == b"authorization":
                scheme, _, token = v.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = token.strip()
        if given is not None and hmac.compare_digest(given, self.key):
            return None
        why = "no API key was given" if given is None else "the API key is not this server's"
        return RequestError(f"{why}: send it as 'Authorization: Bearer KEY' (serve --api-key)", status=401,
                            code="invalid_api_key")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self._host_refusal(scope.get("headers", ())) or self._key_refusal(scope)
        if refusal is None:
            return await self.app(scope, receive, send)
        extra = [(b"www-authenticate", b"Bearer")] if refusal.status == 401 else []
        await _send_error(send, refusal, extra)


class BodyTimeout:
    """ASGI middleware: a request body not received whole within ``seconds`` of the
    request's start is answered 408 and the connection closed."""

    def __init__(self, app, seconds: float):
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        deadline = time.monotonic() + self.seconds
        complete = False
        started = False  # the application's answer has begun
        refused = False  # the 408 was sent: what the application sends after it is dropped

        async def timed_receive():
            nonlocal complete, refused
            if complete:  # past the body: waiting for a disconnect is not bounded
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                if not started and not refused:
                    refused = True
                    e = RequestError(f"the request body did not arrive within {self.seconds:g} s (serve "
                                     f"--body-timeout)", status=408, code="request_timeout")
                    await _send_error(send, e, [(b"connection", b"close")])
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        async def guarded_send(message):
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, timed_receive, guarded_send)
