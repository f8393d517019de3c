"""`ngramcache serve` against hostile clients, each test against a real server process on
127.0.0.1 (the packaged SmolLM2) through the official ``openai`` client or raw HTTP:

* the API key on every route but /health and the page's files, route by route (401 in
  OpenAI's shape), the Host allow-list, FastAPI's own pages off;
* prompts refused by their length before any tokenizer work, while a small request and
  /health keep answering;
* connections that send nothing, or a head a byte at a time, closed; the connection bound
  making room for a new client;
* every bad body an OpenAI-shaped 4xx with its documented code (a lone surrogate in a key,
  a body that is not UTF-8, deep nesting, a huge integer);
* SIGTERM while a prompt is tokenized (503 shutting_down), a second signal (an exit at
  once, no traceback), a port in use, a --memory that is a pipe or a link to nowhere.

Every wait is bounded."""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("llama_cpp")

from support import FIXED_DRAFT, SERVE_CTX, Server

pytestmark = pytest.mark.model

KEY = "test-key-0123456789"


def _request(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
             timeout: float = 120) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request over a fresh connection."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def _error(raw: bytes) -> dict:
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return err


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    key_file = tmp_path_factory.mktemp("key") / "key"
    key_file.write_text(KEY + "\n")
    s = Server(FIXED_DRAFT, "--no-memory", "--api-key-file", str(key_file), "--max-queue", "4",
               "--max-connections", "40", "--header-timeout", "5", "--body-timeout", "3")
    yield s
    s.stop()


AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = json.dumps({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}).encode()
COMPLETION = json.dumps({"prompt": "Hello", "max_tokens": 2}).encode()
# every route, and what it answers with the key
ROUTES = [("GET", "/v1/models", None, 200), ("GET", "/v1/models/smollm2", None, 200),
          ("POST", "/v1/completions", COMPLETION, 200), ("POST", "/v1/chat/completions", CHAT, 200),
          ("GET", "/metrics", None, 200), ("GET", "/docs", None, 404), ("GET", "/redoc", None, 404),
          ("GET", "/openapi.json", None, 404), ("GET", "/no-such-route", None, 404)]


# --- access -------------------------------------------------------------------------------


@pytest.mark.parametrize("method,path,body,with_key", ROUTES, ids=[r[1] for r in ROUTES])
def test_every_route_but_health_needs_the_key(server, method, path, body, with_key):
    for headers, why in (({}, "no API key"), ({"Authorization": "Bearer wrong"}, "not this server's"),
                         ({"Authorization": KEY}, "no API key")):
        status, head, raw = _request(server.url, method, path, body, headers)
        err = _error(raw)
        assert status == 401 and err["code"] == "invalid_api_key" and why in err["message"], (path, raw)
        assert err["type"] == "invalid_request_error" and head.get("www-authenticate") == "Bearer"
    status, _, raw = _request(server.url, method, path, body, AUTH)
    assert status == with_key, raw


@pytest.mark.parametrize("path", ["/health", "/", "/favicon.ico"])
def test_health_and_the_page_answer_without_the_key(server, path):
    status, _, raw = _request(server.url, "GET", path)
    assert status == 200
    if path == "/health":
        assert json.loads(raw)["status"] == "ok"


def test_the_openai_client_needs_the_key(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="smollm2", prompt="hi", max_tokens=2)
    good = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    assert [m.id for m in good.models.list()] == ["smollm2"]
    r = good.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Say hi."}],
                                     max_tokens=4, temperature=0)
    assert r.choices[0].message.content


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:80", "127.0.0.2", "[::2]:80"])
def test_a_foreign_host_header_is_refused_even_on_health(server, host):
    for path in ("/health", "/v1/models"):
        status, _, raw = _request(server.url, "GET", path, headers={"Host": host, **AUTH})
        err = _error(raw)
        assert status == 421 and err["code"] == "invalid_host", raw


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1234", "127.0.0.1", "[::1]:8080"])
def test_local_host_names_are_answered(server, host):
    status, _, raw = _request(server.url, "GET", "/v1/models", headers={"Host": host, **AUTH})
    assert status == 200, raw


# --- bodies -------------------------------------------------------------------------------


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "speculative": {"\\ud800": 1}}', "speculative.\\ud800"),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 2, "speculative": {"drafter": "\\udfff"}}',
     "speculative.drafter"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "\\ud83d": 1}', "\\ud83d"),
    ("/v1/completions", b'{"prompt": "hi", "model": "a\\udc00b"}', "model"),
])
def test_a_lone_surrogate_anywhere_is_a_400(server, path, body, param):
    status, _, raw = _request(server.url, "POST", path, body, AUTH)
    err = _error(raw)
    assert status == 400 and err["code"] == "invalid_unicode" and err["param"] == param, raw
    assert "surrogate" in err["message"]


@pytest.mark.parametrize("body,words", [
    (b'{"prompt": "caf\xe9", "max_tokens": 2}', "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "not valid JSON"),
    (b'{"prompt": "hi", "max_tokens": 2', "not valid JSON"),
    (b'"just a string"', "must be a JSON object"),
])
def test_a_body_that_is_not_json_text_is_invalid_json(server, body, words):
    status, _, raw = _request(server.url, "POST", "/v1/completions", body, AUTH)
    err = _error(raw)
    assert status == 400 and err["code"] == "invalid_json" and words in err["message"], raw


def test_huge_integers_in_fields_are_a_4xx(server):
    for field in ("max_tokens", "seed", "top_k", "n"):
        body = json.dumps({"prompt": "hi", field: 10 ** 4000}).encode()
        status, _, raw = _request(server.url, "POST", "/v1/completions", body, AUTH)
        assert 400 <= status < 500 and _error(raw)["code"], (field, raw)


# --- load: refused by length, connections that send nothing ----------------------------------


def test_long_prompts_are_refused_by_length_while_small_requests_answer(server):
    prompt = "The quick brown fox jumps over the lazy dog. " * 90_000  # 4 MB: far past the context
    body = json.dumps({"prompt": prompt, "max_tokens": 1}).encode()
    answers = []

    def big():
        answers.append(_request(server.url, "POST", "/v1/completions", body, AUTH, timeout=300))

    threads = [threading.Thread(target=big) for _ in range(12)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    status, _, raw = _request(server.url, "POST", "/v1/chat/completions", CHAT, AUTH, timeout=300)
    small = time.monotonic() - t0
    for t in threads:
        t.join(300)
    assert status == 200, raw
    assert len(answers) == 12
    for status, _, raw in answers:
        err = _error(raw)
        assert status == 400 and err["code"] == "context_length_exceeded" and "bytes" in err["message"], raw
    # a tokenizer pass over 48 MB took most of a minute; refused by length it is nothing
    assert small < 15, f"a 2-token chat took {small:.1f} s beside 12 long prompts"


def test_a_connection_that_sends_nothing_or_a_slow_head_is_closed(server):
    host, port = server.url.removeprefix("http://").split(":")
    silent = socket.create_connection((host, int(port)), timeout=30)
    slow = socket.create_connection((host, int(port)), timeout=30)
    t0 = time.monotonic()
    try:
        for _ in range(8):  # a header byte now and then: never a whole head
            slow.sendall(b"G" if _ == 0 else b"x")
            time.sleep(0.5)
        for sock in (silent, slow):
            assert sock.recv(1024) == b"", "the server kept a connection that sent no head"
    except (ConnectionResetError, BrokenPipeError):
        pass
    finally:
        silent.close()
        slow.close()
    assert time.monotonic() - t0 < 20


def test_idle_connections_make_room_for_a_new_client(server):
    host, port = server.url.removeprefix("http://").split(":")
    t0 = time.monotonic()
    idle = [socket.create_connection((host, int(port)), timeout=30) for _ in range(60)]  # over the 40 allowed
    try:
        status, _, raw = _request(server.url, "GET", "/health")
        assert status == 200
        time.sleep(0.5)  # the closes are on their way
        readable, _, _ = select.select(idle, [], [], 0)  # a closed connection reads its end at once
        closed = [sock in readable and sock.recv(1) == b"" for sock in idle]
        # the oldest made room (21: the 61st connection was /health's), the newest are kept,
        # all told before the 5 s head timeout could have closed any
        assert time.monotonic() - t0 < 4, "too slow to tell eviction from the head timeout"
        assert closed == [True] * 21 + [False] * 39, closed
    finally:
        for sock in idle:
            sock.close()


def test_a_body_that_does_not_arrive_is_a_408(server):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"prompt\"".encode())
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.split()[1] == b"408"
    assert _error(body)["code"] == "request_timeout"


# --- signals ------------------------------------------------------------------------------

# A chat template whose rendering (inside the tokenizer step) takes most of a minute.
SLOW_TEMPLATE = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                 "{% for m in messages %}{{ m.content }}{% endfor %}")


def _slow_chat_server(tmp_path, *flags) -> Server:
    template = tmp_path / "slow.jinja"
    template.write_text(SLOW_TEMPLATE)
    return Server(FIXED_DRAFT, "--no-memory", "--chat-template-file", str(template), *flags)


def _post_in_thread(url: str, body: bytes, out: dict) -> threading.Thread:
    def send():
        try:
            out["answer"] = _request(url, "POST", "/v1/chat/completions", body, timeout=120)
        except OSError as e:
            out["answer"] = e

    t = threading.Thread(target=send)
    t.start()
    return t


def test_sigterm_while_a_prompt_is_tokenized_is_a_503_shutting_down(tmp_path):
    s = _slow_chat_server(tmp_path, "--shutdown-timeout", "1")
    out: dict = {}
    try:
        t = _post_in_thread(s.url, CHAT, out)
        time.sleep(2)  # the request is in the tokenizer step now
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        t.join(30)
        answered = time.monotonic() - t0
    finally:
        s.stop(signal.SIGKILL)
    status, head, raw = out["answer"]
    assert status == 503 and head["content-type"] == "application/json", raw
    err = _error(raw)
    assert err["code"] == "shutting_down" and err["type"] == "server_error"
    assert answered < 10
    assert "Traceback" not in "".join(s.log) and "CancelledError" not in "".join(s.log)


@pytest.mark.parametrize("sig,status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_second_signal_exits_at_once_without_tracebacks(sig, status):
    s = Server(FIXED_DRAFT, "--no-memory", "--shutdown-timeout", "60")
    out: dict = {}
    long = json.dumps({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 1500, "speculative": {"enabled": False},
                       "cache_prompt": False}).encode()
    try:
        def send():
            try:
                out["answer"] = _request(s.url, "POST", "/v1/completions", long, timeout=120)
            except OSError as e:
                out["answer"] = e

        t = threading.Thread(target=send)
        t.start()
        deadline = time.monotonic() + 60
        while not json.loads(s.get("/health"))["busy"] and time.monotonic() < deadline:
            time.sleep(0.05)
        s.proc.send_signal(sig)
        time.sleep(1)
        assert s.proc.poll() is None, "the first signal did not wait for the running request"
        t0 = time.monotonic()
        s.proc.send_signal(sig)
        rc = s.proc.wait(30)
        took = time.monotonic() - t0
        t.join(30)
    finally:
        s.stop(signal.SIGKILL)
    assert rc == status and took < 5, (rc, took)
    log = "".join(s.log)
    assert "Traceback" not in log and "KeyboardInterrupt" not in log and "CancelledError" not in log, log
    assert "second signal: exiting now" in log


def _serve(*flags, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ngramcache", "serve", "-m", "smollm2", "-c", str(SERVE_CTX),
                           FIXED_DRAFT, *flags], capture_output=True, text=True, timeout=timeout)


def test_a_port_in_use_is_one_line_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        r = _serve("--port", str(port))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr == f"ngramcache serve: error: 127.0.0.1:{port}: the address is already in use (another " \
                       f"server? choose another --port)\n", r.stderr
    assert time.monotonic() - t0 < 30


def test_listening_beyond_this_machine_without_a_key_warns():
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = _serve("--host", "0.0.0.0", "--port", str(port))
        keyed = subprocess.run([sys.executable, "-m", "ngramcache", "serve", "--host", "0.0.0.0", "--port",
                                str(port)], capture_output=True, text=True, timeout=60,
                               env={**os.environ, "NGRAMCACHE_API_KEY": KEY})
    assert "warning: listening on 0.0.0.0 without an API key" in r.stderr and r.returncode == 1
    assert "warning" not in keyed.stderr and keyed.returncode == 1


def test_a_memory_that_is_a_pipe_or_a_link_to_nowhere_is_refused_at_start(tmp_path):
    fifo = tmp_path / "memory.fifo"
    os.mkfifo(fifo)
    r = _serve("--port", "0", "--memory", str(fifo))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{fifo}: is a pipe (FIFO), not a regular memory file" in r.stderr, r.stderr
    link = tmp_path / "memory.bin"
    link.symlink_to(tmp_path / "gone" / "memory.bin")
    r = _serve("--port", "0", "--memory", str(link))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"--memory {link}: a symbolic link to {tmp_path / 'gone' / 'memory.bin'}, which does not exist" in r.stderr
