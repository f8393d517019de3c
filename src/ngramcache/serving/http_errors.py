"""Errors as OpenAI's API sends them, from the engine's typed errors; the checks on a
request that come before any model work (its size, its text)."""

from __future__ import annotations

import json

from ngramcache.serving.errors import BodyTooLargeError, EngineError, RequestError

__all__ = ["error_body", "error_json", "error_response", "check_text", "BodyLimit"]


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_json(e: EngineError) -> bytes:
    """OpenAI's error object for ``e`` as bytes. ASCII JSON: a message or parameter that
    quotes the request (a key holding a lone surrogate) is escaped, never a failure."""
    return json.dumps(error_body(e.message, e.type, e.param, e.code)).encode("ascii")


def error_response(e: EngineError, headers: dict | None = None):
    """The JSON response for ``e``: its status, its type, code and parameter."""
    from fastapi.responses import Response

    return Response(error_json(e), status_code=e.status, media_type="application/json", headers=headers)


def check_text(text: str, param: str) -> str:
    """``text`` if it can be encoded as UTF-8; else ``RequestError`` (400) naming
    ``param``: JSON lets a request carry a lone surrogate (``"\\ud800"``), which is no
    text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"{param}: a lone surrogate (U+{ord(text[e.start]):04X}) at character {e.start} "
                           f"is not text", param=param, code="invalid_unicode") from None
    return text


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413 with
    OpenAI's error body, by its Content-Length before it is read or, for a body sent
    without one, as soon as it passes the limit (the application's own answer is then
    dropped)."""

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    def _refusal(self) -> tuple[dict, dict]:
        e = BodyTooLargeError(f"the request body is larger than this server takes ({self.limit} bytes; "
                              f"serve --max-body-bytes)")
        body = error_json(e)
        start = {"type": "http.response.start", "status": e.status,
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                             (b"connection", b"close")]}
        return start, {"type": "http.response.body", "body": body}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for key, value in scope.get("headers", ()):
            if key == b"content-length" and value.isdigit() and int(value) > self.limit:
                for message in self._refusal():
                    await send(message)
                return
        seen = 0
        refused = False
        started = False

        async def counted_receive():
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    refused = True
                    if not started:
                        for m in self._refusal():
                            await send(m)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not refused:
                raise
