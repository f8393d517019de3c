"""An OpenAI-compatible HTTP server on an :class:`ngramcache.serving.engine.Engine`
(``pip install 'ngramcache[serve]'``: FastAPI, uvicorn, prometheus-client).

``create_app(engine)`` is the ASGI application; ``python -m ngramcache serve`` runs it
with uvicorn. Endpoints (docs/serve.md): ``/v1/completions``, ``/v1/chat/completions``
(``stream: true`` sends server-sent events), ``/v1/models``, ``/health``, ``/metrics``
(Prometheus text) and ``/`` (a chat page that marks the text that came from accepted
drafts; its icon is also at ``/favicon.ico``). Errors are OpenAI's body, with the status
and parameter that the engine's typed errors (``ngramcache.serving.errors``) carry.

A request is refused as cheaply as it can be: by its Host header and API key
(``ngramcache.serving.guards``), its size, its JSON, and a prompt by its length in bytes
before any tokenizer work; tokenizations run a few at a time, the others wait within the
engine's queue bound.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import threading
import time
import uuid
from importlib import resources
from typing import Any

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("the server needs its extra: pip install 'ngramcache[serve]'") from e

from ngramcache.serving.guards import BodyTimeout, Gate
from ngramcache.serving.http_errors import BodyLimit, check_text, error_body, error_response
from ngramcache.serving.metrics import metrics_text
from ngramcache.serving.engine import Engine
from ngramcache.serving.errors import (EngineError, ModelNotFoundError, QueueFullError, RequestError,
                                       ShuttingDownError)
from ngramcache.serving.jobs import Job, JobResult
from ngramcache.serving.requests import ChatRequest, CommonFields, CompletionRequest, field_error, parse_body

__all__ = ["create_app", "metrics_text"]

#: the default of ``create_app``'s ``max_body_bytes`` and of ``serve --max-body-bytes``
MAX_BODY_BYTES = 16 * 1024 * 1024
#: the default of ``create_app``'s ``body_timeout`` and of ``serve --body-timeout`` (seconds)
BODY_TIMEOUT = 60.0
#: prompts tokenized at once (the others wait their turn): tokenizing holds a core each
TOKENIZING = 2

def _page_icon() -> bytes:
    """The chat page's icon, an SVG the page carries inline (a data: URL), so that a client
    that asks for /favicon.ico anyway (a browser showing /health or /metrics) gets it, not a 404."""
    page = resources.files("ngramcache").joinpath("data/chat.html").read_text(encoding="utf-8")
    m = re.search(r'<link rel="icon" type="image/svg\+xml" href="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', page)
    if m is None:
        raise RuntimeError("data/chat.html has no inline SVG icon")
    return base64.b64decode(m.group(1))


def create_app(engine: Engine, aliases: tuple[str, ...] = (), close_engine: bool = False,
               shutdown_timeout: float = 5.0, max_body_bytes: int | None = MAX_BODY_BYTES, *,
               api_key: str | None = None, allowed_hosts=None, openapi_docs: bool = False,
               body_timeout: float | None = BODY_TIMEOUT, tokenizing: int = TOKENIZING) -> "FastAPI":
    """The ASGI application serving ``engine`` (its model answers to
    ``engine.model_name`` and to each name in ``aliases``).

    ``api_key``: every route but ``/health`` and the page's static files needs
    ``Authorization: Bearer KEY`` (None: open). ``allowed_hosts``: the Host names
    answered (None: any). ``openapi_docs``: serve FastAPI's ``/docs``, ``/redoc`` and
    ``/openapi.json``. ``body_timeout``: seconds a request body may take to arrive (None:
    no bound). ``tokenizing``: prompts tokenized at once; the others wait, as many as
    ``engine.max_queue`` (more are refused 503 ``queue_full``).

    ``close_engine``: close the engine when the application shuts down. ``await
    app.state.drain()`` does it first, as ``serve`` does at SIGTERM before the server
    closes its connections: the queued requests are answered 503, the running one may
    finish for ``shutdown_timeout`` seconds and is then stopped and answered 503 (a
    stream: an error event, then ``[DONE]``), and the memory is saved.
    ``max_body_bytes``: larger request bodies are refused with 413 (None: no bound)."""

    closing = asyncio.Event()  # set when the drain begins: requests still tokenizing are answered 503

    async def drain() -> bool:
        """Close the engine as described above; False if it did not stop in time."""
        closing.set()
        return await asyncio.to_thread(engine.close, shutdown_timeout, max(10.0, shutdown_timeout))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        if close_engine:
            await drain()

    docs = {} if openapi_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="ngramcache", description="OpenAI-compatible server with draft-free speculative decoding",
                  lifespan=lifespan, **docs)
    app.state.drain = drain
    # the last added runs first: who may ask, then how much, then how slowly
    if body_timeout is not None:
        app.add_middleware(BodyTimeout, seconds=body_timeout)
    if max_body_bytes is not None:
        app.add_middleware(BodyLimit, limit=max_body_bytes)
    if api_key is not None or allowed_hosts is not None:
        app.add_middleware(Gate, api_key=api_key, allowed_hosts=allowed_hosts)
    names = {engine.model_name, *aliases}
    created = int(time.time())

    @app.exception_handler(EngineError)
    async def _engine_error(request, exc: EngineError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_response(RequestError("the request body is not valid JSON", code="invalid_json"))
        return error_response(field_error(errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        e = EngineError(str(exc.detail), status=exc.status_code,
                        code={404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request"))
        if exc.status_code == 404:
            e.type = "not_found_error"
        return error_response(e)

    from ngramcache.integrations.exactness import exactness_status

    # read once, before any request: whether drafting can change greedy output on this model
    # (the stored check-exact answer, else what its settings predict; nothing is run)
    exact = exactness_status(getattr(engine, "llm", None))

    slots = asyncio.Semaphore(max(1, tokenizing))
    waiting = 0  # requests waiting for a tokenizer slot

    async def _unless_closing(aw):
        """``aw``'s result, or ``ShuttingDownError`` as soon as the drain begins (the
        request is answered 503 then, not cut off when the server stops)."""
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(closing.wait())
        try:
            done, _ = await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task in done:
            return task.result()
        task.cancel()
        raise ShuttingDownError("the server is shutting down")

    async def _tokenize(fn, *args):
        """``fn(*args)`` on a thread, at most ``tokenizing`` at once; a request that would
        wait beyond the engine's queue bound is refused 503, as one over it in the engine."""
        nonlocal waiting
        if engine.closed or closing.is_set():
            raise ShuttingDownError("the server is shutting down")
        if slots.locked():
            if engine.max_queue is not None and waiting >= engine.max_queue:
                raise QueueFullError(f"{waiting} requests are waiting to be tokenized already (the most this "
                                     f"server queues); try again later")
            waiting += 1
            try:
                await _unless_closing(slots.acquire())
            finally:
                waiting -= 1
        else:
            await slots.acquire()
        try:
            return await _unless_closing(_on_daemon_thread(fn, *args))
        finally:
            slots.release()

    def _text_bytes(text: str) -> int:
        return len(text) if text.isascii() else len(text.encode("utf-8"))

    @app.get("/health")
    async def health():
        return {"status": "shutting_down" if engine.closed else "ok", "model": engine.model_name,
                "queued": engine.queued, "busy": engine.running is not None, "exact": exact}

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
            raise ModelNotFoundError(f"the model {model_id!r} does not exist", param="model")
        return {"id": model_id, "object": "model", "created": created, "owned_by": "ngramcache"}

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return resources.files("ngramcache").joinpath("data/chat.html").read_text(encoding="utf-8")

    icon = _page_icon()

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon():
        return Response(icon, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    def _job(body: CommonFields, prompt, max_tokens: int | None, default_max: int) -> Job:
        if body.model and body.model not in names:
            raise ModelNotFoundError(f"the model {body.model!r} does not exist (this server has "
                                     f"{', '.join(sorted(names))})", param="model")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stop) > 16:
            raise RequestError("stop: at most 16 sequences", param="stop")
        for i, s in enumerate(stop):
            check_text(s, f"stop.{i}" if isinstance(body.stop, list) else "stop")
        if max_tokens is None:
            max_tokens = min(default_max, max(0, engine.n_ctx - int(prompt.size)))
        temperature = body.temperature if body.temperature is not None else engine.temperature
        return Job(prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                   top_p=body.top_p if body.top_p is not None else 1.0, top_k=body.top_k or 0, seed=body.seed,
                   stop=stop, speculative=body.speculative, cache_prompt=body.cache_prompt)

    async def _wait(job: Job, request: Request) -> JobResult:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        job.on_done = lambda: loop.call_soon_threadsafe(done.set)
        engine.submit(job)
        try:
            while not done.is_set():
                try:
                    await asyncio.wait_for(done.wait(), 0.25)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        job.cancel()
        except asyncio.CancelledError:  # the server gave up on this request: so does the model
            job.cancel()
            raise
        return _result(job)

    def _result(job: Job) -> JobResult:
        if isinstance(job.error, EngineError):
            raise job.error
        if job.error is not None:
            raise EngineError(f"generation failed: {type(job.error).__name__}: {job.error}", status=500)
        return job.result

    def _usage(r: JobResult) -> dict:
        return {"prompt_tokens": r.n_prompt, "completion_tokens": r.n_tokens,
                "total_tokens": r.n_prompt + r.n_tokens,
                "prompt_tokens_details": {"cached_tokens": r.n_cached}}

    def _stream(job: Job, make_chunk, final_chunk):
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        job.on_text = lambda text, drafted: loop.call_soon_threadsafe(q.put_nowait, (text, drafted))
        job.on_done = lambda: loop.call_soon_threadsafe(q.put_nowait, None)
        engine.submit(job)

        async def events():
            try:
                yield _sse(make_chunk(None, False))  # the role, at once: time to first byte
                while True:
                    item = await q.get()
                    if item is None:
                        break
                    yield _sse(make_chunk(*item))
                if job.error is not None:
                    err = job.error if isinstance(job.error, EngineError) else EngineError(
                        f"generation failed: {type(job.error).__name__}: {job.error}", status=500)
                    yield _sse(error_body(err.message, err.type, err.param, err.code))
                else:
                    yield _sse(final_chunk(job.result))
                yield "data: [DONE]\n\n"
            finally:
                # the client went away (or the stream ended): stop the job at its next step
                job.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # The bodies are parsed here rather than by FastAPI, so that every way a body can be
    # wrong has its own code (parse_body); the schema is still in /openapi.json.
    def _body_schema(model):
        return {"requestBody": {"required": True,
                                "content": {"application/json": {"schema": model.model_json_schema()}}}}

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request):
        body = parse_body(await request.body(), CompletionRequest)
        if engine.closed:
            raise ShuttingDownError("the server is shutting down")
        if isinstance(body.prompt, str):
            if not body.prompt:
                raise RequestError("prompt is empty", param="prompt")
            engine.check_text_fits(_text_bytes(body.prompt), "prompt")
            prompt = await _tokenize(engine.tokenize, check_text(body.prompt, "prompt"))
        else:
            prompt = engine.check_tokens(body.prompt)
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

            return _stream(job, chunk, final)
        r = await _wait(job, request)
        return base({"index": 0, "text": r.text, "finish_reason": _finish(r), "logprobs": None},
                    {"usage": _usage(r), "ngramcache": r.figures()})

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatRequest))
    async def chat_completions(request: Request):
        body = parse_body(await request.body(), ChatRequest)
        if engine.closed:
            raise ShuttingDownError("the server is shutting down")
        if engine.chat_template is None:
            raise RequestError("this model has no chat template in its GGUF: give one with --chat-template-file, "
                               "or use /v1/completions", param="messages")
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text(f"messages.{i}.content")}
                    for i, m in enumerate(body.messages)]
        # the rendered prompt holds every message's text, and more
        engine.check_text_fits(sum(_text_bytes(m["content"]) for m in messages), "messages")
        try:
            prompt = await _tokenize(lambda: engine.tokenize(engine.chat_template.render(messages)))
        except ValueError as e:  # the template's own refusal (a RequestError is one too: passed on)
            if isinstance(e, EngineError):
                raise
            raise RequestError(str(e), param="messages") from None
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        try:
            job = _job(body, prompt, max_tokens, engine.n_ctx)
            rid = f"chatcmpl-{uuid.uuid4().hex}"
            now = int(time.time())

            def base(choice, extra=None, object_="chat.completion") -> dict:
                return _envelope(rid, object_, now, body.model or engine.model_name, choice, extra)

            if body.stream:
                def chunk(text, drafted):
                    if text is None:
                        return base({"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}, object_="chat.completion.chunk")
                    return base({"index": 0, "delta": {"content": text}, "finish_reason": None},
                                {"ngramcache": {"from_draft": drafted}}, object_="chat.completion.chunk")

                def final(r: JobResult):
                    return base({"index": 0, "delta": {}, "finish_reason": _finish(r)},
                                {"usage": _usage(r), "ngramcache": r.figures()}, object_="chat.completion.chunk")

                return _stream(job, chunk, final)
            r = await _wait(job, request)
        except EngineError as e:
            if e.param == "prompt":  # the prompt of a chat is its messages
                e.param = "messages"
            raise
        return base({"index": 0, "message": {"role": "assistant", "content": r.text}, "finish_reason": _finish(r)},
                    {"usage": _usage(r), "ngramcache": r.figures()})

    return app


async def _on_daemon_thread(fn, *args):
    """``fn(*args)`` on a daemon thread of its own: a tokenization that a shutdown stopped
    waiting for (its request answered 503) does not hold the process's exit, as a thread
    of asyncio's executor would."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result, error):
        if not future.done():
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    def work():
        try:
            outcome = (fn(*args), None)
        except BaseException as e:  # the request's error, raised where it waits
            outcome = (None, e)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop has closed: no one waits any more
            pass

    threading.Thread(target=work, name="ngramcache-tokenize", daemon=True).start()
    return await future


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
