"""The request bodies of the OpenAI-compatible API and how a raw body becomes one: every way a
body can be wrong (not UTF-8, not JSON, nested too deeply, a lone surrogate anywhere, a field of
the wrong type or range) is a ``RequestError`` with its documented code, never a 500."""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from ngramcache.serving.errors import RequestError
from ngramcache.serving.http_errors import check_text

__all__ = ["CommonFields", "CompletionRequest", "ChatRequest", "Message", "parse_body", "field_error"]

# ---------------------------------------------------------------------------------
# request bodies (fields OpenAI's API has and we do not use are accepted and ignored)


class CommonFields(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=0, le=2**31 - 1)
    seed: StrictInt | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: StrictBool = False
    n: StrictInt = Field(default=1, ge=1, le=1)
    # checked once, by the engine (ngramcache.serving.engine.resolve_speculative)
    speculative: dict[str, Any] | None = None
    cache_prompt: StrictBool = True


class CompletionRequest(CommonFields):
    prompt: Union[str, list[StrictInt]]


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[_Part], None] = None

    def text(self, param: str) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return check_text(self.content, param)
        return "".join(check_text(p.text, f"{param}.{i}.text") for i, p in enumerate(self.content))


class ChatRequest(CommonFields):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=0)


_SURROGATE = re.compile("[\ud800-\udfff]")
# JSON text brings a lone surrogate in only as an escape (UTF-8 cannot encode one): a body
# without "\uD800".."\uDFFF" escapes needs no walk (a search of 16 MB of text as a str
# takes 80 ms, of its bytes 4 ms)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _escaped(key: str) -> str:
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_unicode(data) -> None:
    """``RequestError`` (400, ``invalid_unicode``) naming the first key or value of ``data``
    that holds a lone surrogate (JSON lets a request carry ``"\\ud800"``, which is no text:
    it cannot be tokenized, echoed or logged). Iterative: the depth is the parser's bound."""
    stack = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            items = ()
            bad = _SURROGATE.search(value)
            where = path
        elif isinstance(value, dict):
            items = list(value.items())
            bad = next((m for m in map(_SURROGATE.search, value) if m), None)
            where = path
            if bad is not None:
                where = f"{path}.{_escaped(bad.string)}" if path else _escaped(bad.string)
        elif isinstance(value, list):
            items = list(enumerate(value))
            bad = None
        else:
            continue
        if bad is not None:
            raise RequestError(f"{where or 'body'}: a lone surrogate (U+{ord(bad.group()):04X}) at character "
                               f"{bad.start()} is not text", param=where or None, code="invalid_unicode")
        for k, v in reversed(items):
            stack.append((f"{path}.{k}" if path else str(k), v))


def parse_body(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """A request body as ``model``; every way it can be wrong is a ``RequestError``:
    ``invalid_json`` (not UTF-8, not JSON, nested too deeply, a number too long),
    ``invalid_unicode`` (a lone surrogate anywhere), 422 ``invalid_field``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"the request body is not UTF-8 (byte {e.start}: 0x{raw[e.start]:02x})",
                           code="invalid_json") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise RequestError("the request body is not valid JSON: nested too deeply", code="invalid_json") from None
    except ValueError as e:  # JSONDecodeError, and an integer past Python's digit limit
        raise RequestError(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, not {type(data).__name__}",
                           code="invalid_json")
    if _SURROGATE_ESCAPE.search(raw):
        _check_unicode(data)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise field_error(e.errors()) from None
    except RecursionError:
        raise RequestError("the request body is nested too deeply", code="invalid_json") from None


def field_error(errors) -> RequestError:
    """422 ``invalid_field`` naming the first field at fault and listing every problem."""
    def where(e) -> str:
        return ".".join(_escaped(str(x)) for x in e.get("loc", ()) if x != "body")

    first = errors[0] if errors else {}
    detail = "; ".join(f"{where(e) or 'body'}: {e.get('msg')}" for e in errors)
    return RequestError(_escaped(detail), param=where(first) or None, status=422, code="invalid_field")


# ---------------------------------------------------------------------------------
# the application
