"""An OpenAI-compatible HTTP server on an :class:`ngramcache.serving.engine.Engine`
(``pip install 'ngramcache[serve]'``: FastAPI, uvicorn, prometheus-client).

``create_app(engine)`` is the ASGI application; ``python -m ngramcache serve`` runs it
with uvicorn. Endpoints (docs/serve.md): ``/v1/completions``, ``/v1/chat/completions``
(``stream: true`` sends server-sent events), ``/v1/models``, ``/health``, ``/metrics``
(Prometheus text) and ``/`` (a chat page that marks the text that came from accepted
drafts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from importlib import resources
from typing import Any, Literal, Union

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("the server needs its extra: pip install 'ngramcache[serve]'") from e

from ngramcache.serving.engine import Engine, EngineError, Job, JobResult

__all__ = ["create_app", "metrics_text"]

# ---------------------------------------------------------------------------------
# request bodies (fields OpenAI's API has and we do not use are accepted and ignored)


class Speculative(BaseModel):
    """Per-request control of drafting."""

    model_config = ConfigDict(extra="forbid")
    enabled: StrictBool = True
    drafter: str | None = None
    n_draft: StrictInt | None = Field(default=None, ge=0, le=256)


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=0)
    seed: StrictInt | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    stream: StrictBool = False
    n: StrictInt = Field(default=1, ge=1, le=1)
    speculative: Speculative | None = None
    cache_prompt: StrictBool = True


class CompletionRequest(_Common):
    prompt: Union[str, list[StrictInt]]


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[_Part], None] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=0)


# ---------------------------------------------------------------------------------
# errors, as OpenAI's API sends them


def _error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
           code: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status,
                        content={"error": {"message": message, "type": type_, "param": param, "code": code}})


class _ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


# ---------------------------------------------------------------------------------
# metrics


def metrics_text(engine: Engine) -> bytes:
    """The engine's counters in Prometheus' text format (prometheus-client)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self):
            c, s = engine.snapshot()
            for key, help_ in (("requests", "requests run (finished, failed or cancelled)"),
                               ("cancelled", "requests cancelled (the client went away)"),
                               ("failed", "requests that failed"),
                               ("prompt_tokens", "prompt tokens"),
                               ("prompt_tokens_cached", "prompt tokens reused from the KV cache"),
                               ("tokens", "tokens generated"),
                               ("drafted", "drafted tokens verified"),
                               ("accepted", "drafted tokens accepted")):
                yield CounterMetricFamily(f"ngramcache_{key}", help_, value=c.get(key, 0))
            for key, help_ in (("queue", "waiting for the model"), ("prompt", "decoding prompts"),
                               ("draft", "drafting"), ("verify", "verifying drafts and choosing tokens"),
                               ("total", "generating, prompts included")):
                yield CounterMetricFamily(f"ngramcache_{key}_seconds", f"seconds spent {help_}",
                                          value=s.get(key, 0.0))
            drafted = c.get("drafted", 0)
            yield GaugeMetricFamily("ngramcache_acceptance", "accepted / drafted so far",
                                    value=c.get("accepted", 0) / drafted if drafted else 0.0)
            yield GaugeMetricFamily("ngramcache_queued_requests", "requests waiting", value=engine.queued)
            if engine.memory is not None:
                yield GaugeMetricFamily("ngramcache_memory_bytes", "bytes of cross-request memory",
                                        value=engine.memory.nbytes)
                yield GaugeMetricFamily("ngramcache_memory_tokens", "tokens of cross-request memory",
                                        value=engine.memory.n_tokens)

    registry = CollectorRegistry()
    registry.register(_Collector())
    return generate_latest(registry)


# ---------------------------------------------------------------------------------
# the application


def create_app(engine: Engine, aliases: tuple[str, ...] = (), close_engine: bool = False) -> "FastAPI":
    """The ASGI application serving ``engine`` (its model answers to
    ``engine.model_name`` and to each name in ``aliases``). ``close_engine``: close the
    engine when the server shuts down (it finishes the running request and saves the
    memory), as ``serve`` does: uvicorn ends the process by re-raising SIGTERM or SIGINT
    right after its shutdown, so this is the last place to save."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        if close_engine:
            await asyncio.to_thread(engine.close)

    app = FastAPI(title="ngramcache", description="OpenAI-compatible server with draft-free speculative decoding",
                  lifespan=lifespan)
    names = {engine.model_name, *aliases}
    created = int(time.time())

    @app.exception_handler(_ApiError)
    async def _api_error(request, exc: _ApiError):
        return _error(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _error(400, "the request body is not valid JSON", code="invalid_json")
        first = errors[0] if errors else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        detail = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()) if x != 'body') or 'body'}: {e.get('msg')}"
                           for e in errors)
        return _error(422, detail, param=loc or None, code="invalid_field")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, str(exc.detail), kind)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": engine.model_name, "queued": engine.queued,
                "busy": engine.running is not None}

    @app.get("/metrics")
    async def metrics():
        return Response(metrics_text(engine), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list",
                "data": [{"id": n, "object": "model", "created": created, "owned_by": "ngramcache"}
                         for n in [engine.model_name, *sorted(names - {engine.model_name})]]}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str):
        if model_id not in names:
            raise _ApiError(404, f"the model {model_id!r} does not exist", "not_found_error", "model",
                            "model_not_found")
        return {"id": model_id, "object": "model", "created": created, "owned_by": "ngramcache"}

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return resources.files("ngramcache").joinpath("data/chat.html").read_text(encoding="utf-8")

    def _job(body: _Common, prompt, max_tokens: int | None, default_max: int) -> Job:
        if body.model and body.model not in names:
            raise _ApiError(404, f"the model {body.model!r} does not exist (this server has "
                            f"{', '.join(sorted(names))})", "not_found_error", "model", "model_not_found")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stop) > 16:
            raise _ApiError(400, "stop: at most 16 sequences", param="stop")
        n_prompt = int(prompt.size)
        if max_tokens is None:
            max_tokens = min(default_max, max(0, engine.n_ctx - n_prompt))
        spec = body.speculative.model_dump(exclude_none=True) if body.speculative is not None else None
        job = Job(prompt=prompt, max_tokens=max_tokens, temperature=body.temperature if body.temperature is not None else engine.temperature,
                  top_p=body.top_p if body.top_p is not None else 1.0, top_k=body.top_k or 0, seed=body.seed,
                  stop=stop, speculative=spec, cache_prompt=body.cache_prompt)
        try:
            engine._check(job)
        except EngineError as e:
            param = "max_tokens" if "max_tokens" in str(e) else ("speculative" if "speculative" in str(e)
                                                                  else "prompt")
            raise _ApiError(400, str(e), param=param) from None
        return job

    async def _wait(job: Job, request: Request) -> JobResult:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        job.on_done = lambda: loop.call_soon_threadsafe(done.set)
        _submit(job)
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), 0.25)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel()
        return _result(job)

    def _submit(job: Job) -> None:
        try:
            engine.submit(job)
        except EngineError as e:
            raise _ApiError(503, str(e), "server_error") from None

    def _result(job: Job) -> JobResult:
        if job.error is not None:
            if isinstance(job.error, EngineError):
                status = 503 if "shutting down" in str(job.error) else 400
                raise _ApiError(status, str(job.error), "server_error" if status == 503 else "invalid_request_error")
            raise _ApiError(500, f"generation failed: {type(job.error).__name__}: {job.error}", "server_error")
        return job.result

    def _usage(r: JobResult) -> dict:
        return {"prompt_tokens": r.n_prompt, "completion_tokens": r.n_tokens,
                "total_tokens": r.n_prompt + r.n_tokens,
                "prompt_tokens_details": {"cached_tokens": r.n_cached}}

    def _stream(job: Job, request: Request, make_chunk, final_chunk):
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        job.on_text = lambda text, drafted: loop.call_soon_threadsafe(q.put_nowait, (text, drafted))
        job.on_done = lambda: loop.call_soon_threadsafe(q.put_nowait, None)
        _submit(job)

        async def events():
            try:
                yield _sse(make_chunk(None, False))  # the role, at once: time to first byte
                while True:
                    item = await q.get()
                    if item is None:
                        break
                    yield _sse(make_chunk(*item))
                if job.error is not None:
                    msg = (str(job.error) if isinstance(job.error, EngineError)
                           else f"generation failed: {type(job.error).__name__}: {job.error}")
                    yield _sse({"error": {"message": msg, "type": "server_error", "param": None, "code": None}})
                else:
                    yield _sse(final_chunk(job.result))
                yield "data: [DONE]\n\n"
            finally:
                # the client went away (or the stream ended): stop the job at its next step
                job.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        if isinstance(body.prompt, str):
            if not body.prompt:
                raise _ApiError(400, "prompt is empty", param="prompt")
            prompt = engine.tokenize(body.prompt)
        else:
            try:
                prompt = engine.check_tokens(body.prompt)
            except (EngineError, ValueError) as e:
                raise _ApiError(400, str(e), param="prompt") from None
        job = _job(body, prompt, body.max_tokens, 16)
        rid = f"cmpl-{uuid.uuid4().hex}"
        now = int(time.time())

        def base(choice, extra=None) -> dict:
            return _envelope(rid, "text_completion", now, body.model or engine.model_name, choice, extra)

        if body.stream:
            def chunk(text, drafted):
                if text is None:
                    return base({"index": 0, "text": "", "finish_reason": None, "logprobs": None})
                return base({"index": 0, "text": text, "finish_reason": None, "logprobs": None},
                            {"ngramcache": {"from_draft": drafted}})

            def final(r: JobResult):
                return base({"index": 0, "text": "", "finish_reason": _finish(r), "logprobs": None},
                            {"usage": _usage(r), "ngramcache": r.figures()})

            return _stream(job, request, chunk, final)
        r = await _wait(job, request)
        return base({"index": 0, "text": r.text, "finish_reason": _finish(r), "logprobs": None},
                    {"usage": _usage(r), "ngramcache": r.figures()})

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        if engine.chat_template is None:
            raise _ApiError(400, "this model has no chat template in its GGUF: give one with --chat-template-file, "
                            "or use /v1/completions", param="messages")
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                    for m in body.messages]
        try:
            text = engine.chat_template.render(messages)
        except ValueError as e:
            raise _ApiError(400, str(e), param="messages") from None
        prompt = engine.tokenize(text)
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        job = _job(body, prompt, max_tokens, engine.n_ctx)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        now = int(time.time())

        def base(choice, extra=None, object_="chat.completion") -> dict:
            return _envelope(rid, object_, now, body.model or engine.model_name, choice, extra)

        if body.stream:
            def chunk(text, drafted):
                if text is None:
                    return base({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},
                                object_="chat.completion.chunk")
                return base({"index": 0, "delta": {"content": text}, "finish_reason": None},
                            {"ngramcache": {"from_draft": drafted}}, object_="chat.completion.chunk")

            def final(r: JobResult):
                return base({"index": 0, "delta": {}, "finish_reason": _finish(r)},
                            {"usage": _usage(r), "ngramcache": r.figures()}, object_="chat.completion.chunk")

            return _stream(job, request, chunk, final)
        r = await _wait(job, request)
        return base({"index": 0, "message": {"role": "assistant", "content": r.text}, "finish_reason": _finish(r)},
                    {"usage": _usage(r), "ngramcache": r.figures()})

    return app


def _envelope(rid: str, object_: str, created: int, model: str, choice: dict, extra: dict | None) -> dict:
    # OpenAI's response and chunk shape, one choice, plus our own fields
    out = {"id": rid, "object": object_, "created": created, "model": model, "choices": [choice]}
    if extra:
        out.update(extra)
    return out


def _finish(r: JobResult) -> str:
    return "length" if r.finish_reason == "length" else "stop"


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
