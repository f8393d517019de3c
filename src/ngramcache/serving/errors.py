"""The errors of serving, typed: each carries the HTTP status, OpenAI's error ``type``
and ``code``, and the request parameter at fault, so that the HTTP layer answers by the
error's class and never by reading its text."""

from __future__ import annotations

__all__ = ["EngineError", "RequestError", "ContextOverflowError", "UnavailableError", "ShuttingDownError",
           "QueueFullError", "CancelledError", "ModelNotFoundError", "BodyTooLargeError"]


class EngineError(Exception):
    """A request the engine did not run, or stopped (the message says why).

    ``status``: the HTTP status that answers it; ``param``: the request field at fault
    (None: the request as a whole); ``type`` and ``code``: OpenAI's error ``type`` and
    ``code``."""

    status = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, status: int | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class RequestError(EngineError, ValueError):
    """A request that cannot be run as asked (400 unless told otherwise); a ValueError
    too, as any bad argument. Its code is ``invalid_value`` unless a subclass or the
    raiser names a more precise one."""

    code = "invalid_value"


class ContextOverflowError(RequestError):
    """The prompt, or the prompt and ``max_tokens``, do not fit in the context."""

    code = "context_length_exceeded"


class UnavailableError(EngineError, RuntimeError):
    """The engine cannot take the request now (503)."""

    status = 503
    type = "server_error"


class ShuttingDownError(UnavailableError):
    """The server is shutting down: the request was refused, or stopped where it was."""

    code = "shutting_down"


class QueueFullError(UnavailableError):
    """Too many requests are waiting already."""

    code = "queue_full"


class CancelledError(EngineError):
    """The job was cancelled before it started (its client went away)."""

    status = 499
    code = "cancelled"


class ModelNotFoundError(RequestError):
    """The request names a model this server does not serve."""

    status = 404
    type = "not_found_error"
    code = "model_not_found"


class BodyTooLargeError(RequestError):
    """The request body is larger than the server takes."""

    status = 413
    code = "request_too_large"
