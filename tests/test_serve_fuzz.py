"""The request schema of the HTTP API under generated input (hypothesis), on the application
served by uvicorn on 127.0.0.1 in this process, with a model-free engine: no body, however
wrong, gets a 5xx, and every error is OpenAI's error object with a code. Also each way a
body can be wrong on its own, with its documented code."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("llama_cpp")  # the chat template's renderer
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from support import ServingFakeModel  # noqa: E402

N_CTX = 128


class _Response:
    def __init__(self, status: int, body: bytes):
        self.status_code, self.text = status, body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.text)


class _Client:
    """POSTs to the server on ``port``, one connection each."""

    def __init__(self, port: int):
        self.port = port

    def post(self, path: str, content: bytes | None = None, json: object = None, headers: dict | None = None):
        import json as json_

        body = content if content is not None else json_.dumps(json).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
            r = conn.getresponse()
            return _Response(r.status, r.read())
        finally:
            conn.close()


@pytest.fixture(scope="module")
def client():
    from ngramcache.serving import Engine
    from ngramcache.serving.app import create_app
    from ngramcache.serving.chat_template import ChatTemplate

    engine = Engine(ServingFakeModel(n_ctx=N_CTX), adaptive=False, max_queue=4,
                    chat_template=ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", "", ""))
    app = create_app(engine, close_engine=True, shutdown_timeout=1)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield _Client(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(30)


# text with lone surrogates, control characters, markup and long runs
TEXT = st.one_of(st.text(max_size=40), st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3),
                 st.sampled_from(["", " ", "\x00", "<|im_start|>", "*a " * 50, "é" * 30]))
NUMBER = st.one_of(st.integers(min_value=-(10 ** 30), max_value=10 ** 30), st.sampled_from([10 ** 4000, -1, 0, 1, 2]),
                   st.floats(allow_nan=True, allow_infinity=True), st.booleans())
JSON = st.recursive(st.one_of(st.none(), TEXT, NUMBER),
                    lambda inner: st.one_of(st.lists(inner, max_size=4),
                                            st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)
FIELDS = {
    "model": st.one_of(st.sampled_from(["model", "other"]), JSON),
    "max_tokens": st.one_of(st.integers(min_value=0, max_value=8), NUMBER, JSON),
    "max_completion_tokens": st.one_of(st.integers(min_value=0, max_value=8), JSON),
    "temperature": st.one_of(st.floats(min_value=0, max_value=2), NUMBER),
    "top_p": NUMBER, "top_k": NUMBER, "seed": NUMBER, "n": NUMBER,
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=20), JSON),
    "stream": st.one_of(st.booleans(), JSON),
    "cache_prompt": st.one_of(st.booleans(), JSON),
    "speculative": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
        "enabled": st.one_of(st.booleans(), JSON), "drafter": st.one_of(st.sampled_from(["copy", "suffix", "x"]), JSON),
        "n_draft": st.one_of(st.integers(min_value=-2, max_value=300), JSON), "options": JSON}), JSON),
}
MESSAGE = st.one_of(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "x"]),
                                           "content": st.one_of(TEXT, st.lists(st.fixed_dictionaries(
                                               {"type": st.sampled_from(["text", "image"]), "text": TEXT}),
                                               max_size=3), JSON)}), JSON)
COMPLETION = st.fixed_dictionaries({}, optional={"prompt": st.one_of(TEXT, st.lists(st.integers(-5, 100), max_size=20),
                                                                     JSON), **FIELDS})
CHAT = st.fixed_dictionaries({}, optional={"messages": st.one_of(st.lists(MESSAGE, max_size=4), JSON), **FIELDS})


def _check(r) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"], err


def _body(obj) -> bytes:
    # ensure_ascii: lone surrogates travel as \\udXXX escapes, as JSON allows
    return json.dumps(obj, allow_nan=True).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=COMPLETION)
def test_completions_never_answer_5xx(client, body):
    _check(client.post("/v1/completions", content=_body(body), headers={"Content-Type": "application/json"}))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=CHAT)
def test_chat_never_answers_5xx(client, body):
    _check(client.post("/v1/chat/completions", content=_body(body), headers={"Content-Type": "application/json"}))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.one_of(st.binary(max_size=200), JSON.map(_body)))
def test_any_bytes_never_answer_5xx(client, raw):
    for path in ("/v1/completions", "/v1/chat/completions"):
        _check(client.post(path, content=raw, headers={"Content-Type": "application/json"}))


@pytest.mark.parametrize("raw,code,param", [
    (b'{"prompt": "a", "speculative": {"\\ud800": 1}}', "invalid_unicode", "speculative.\\ud800"),
    (b'{"prompt": ["\\udfff"]}', "invalid_unicode", "prompt.0"),
    (b'{"prompt": "a", "stop": ["x", "\\ud800"]}', "invalid_unicode", "stop.1"),
    (b'{"prompt": "\xff"}', "invalid_json", None),
    (b"{" * 50_000, "invalid_json", None),
    (b"[" * 100_000 + b"]" * 100_000, "invalid_json", None),
    (b'{"prompt": "a", "max_tokens": ' + b"1" * 5000 + b"}", "invalid_json", None),
    (b"", "invalid_json", None),
    (b"null", "invalid_json", None),
    (b'{"prompt": "a", "max_tokens": "3"}', "invalid_field", "max_tokens"),
])
def test_each_bad_body_has_its_code(client, raw, code, param):
    r = client.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    err = r.json()["error"]
    assert r.status_code == (422 if code == "invalid_field" else 400), r.text
    assert err["code"] == code and err["param"] == param, err


def test_a_prompt_past_any_context_is_refused_by_its_length(client):
    # the fake model's longest piece is "<63>", 4 bytes: past 4 * N_CTX bytes nothing fits
    r = client.post("/v1/completions", json={"prompt": "a" * (4 * N_CTX + 1), "max_tokens": 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and "bytes" in err["message"], err
    r = client.post("/v1/completions", json={"prompt": "a" * (N_CTX + 1), "max_tokens": 1})
    err = r.json()["error"]  # short enough to be tokenized: refused by its token count
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and "tokens" in err["message"], err
