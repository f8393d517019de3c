"""`ngramcache serve` under what goes wrong, each against a real server process on
127.0.0.1 with the packaged SmolLM2: text that is not text, huge and oversized bodies,
SIGTERM in the middle of requests, a memory file of another model, a static table that is
damaged. Every wait is bounded."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from support import FIXED_DRAFT, SERVE_CTX, Server, chat, post_raw, raw_post, save_under_way


pytestmark = pytest.mark.model

LONG = 1500  # tokens: far longer than any drain these tests allow


def _events(raw: bytes) -> list:
    """The server-sent events of a stream: JSON objects, and "[DONE]"."""
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture(scope="module")
def server():
    s = Server(FIXED_DRAFT, "--no-memory", "--max-body-bytes", str(12 * 1024 * 1024))
    yield s
    s.stop()


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "a\ud800b", "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": "a\ud800b", "max_tokens": 2, "stream": True}, "prompt"),
    ("/v1/completions", {"prompt": "ab", "max_tokens": 2, "stop": ["\udfff"]}, "stop.0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \ud800"}], "max_tokens": 2},
     "messages.0.content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"},
                                           {"role": "user", "content": [{"type": "text", "text": "\udc00"}]}],
                              "max_tokens": 2, "stream": True}, "messages.1.content.0.text"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(server, path, body, param):
    raw = json.dumps(body)  # ensure_ascii: the surrogate travels as \\udXXX, as JSON allows
    assert "\\ud" in raw
    status, err = server.post(path, raw.encode())
    assert status == 400, err
    assert err["error"]["param"] == param and err["error"]["code"] == "invalid_unicode"
    assert err["error"]["type"] == "invalid_request_error" and "surrogate" in err["error"]["message"]
    assert chat(server.client(), [{"role": "user", "content": "hi"}], max_tokens=2).choices[0].message.content


def test_a_10_mb_prompt_is_refused_by_its_length_before_any_tokenizing(server):
    # tokenizing it would take about 12 s; its length alone says it cannot fit the context
    prompt = ("The quick brown fox jumps over the lazy dog. " * 230_000)[:10_000_000]
    t0 = time.monotonic()
    status, raw = post_raw(server.url + "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": 1}).encode(),
                           300)
    took = time.monotonic() - t0
    err = json.loads(raw)["error"]
    assert status == 400 and err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert "10,000,000 bytes" in err["message"] and took < 6, (err, took)
    assert json.loads(server.get("/health"))["status"] == "ok"


def test_a_body_over_max_body_bytes_is_a_413(server):
    limit = 12 * 1024 * 1024
    # by its Content-Length, before a byte of it is read (the client waits for 100-continue)
    status, body = raw_post(server.url, f"Content-Length: {limit + 1}\r\nExpect: 100-continue\r\n")
    err = body["error"]
    assert status == 413 and set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "request_too_large" and f"{limit} bytes" in err["message"]
    # without a Content-Length (chunked): refused as soon as it passes the limit
    mib = b"x" * (1 << 20)
    parts = [b"%x\r\n%s\r\n" % (len(mib), mib)] * 12 + [b"5\r\nxxxxx\r\n"]
    status, body = raw_post(server.url, "Transfer-Encoding: chunked\r\n", parts)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    # a body under the limit is read as usual
    status, body = raw_post(server.url, "Content-Length: 2\r\n", [b"{}"])
    assert status == 422 and body["error"]["param"] == "prompt"
    assert json.loads(server.get("/health"))["status"] == "ok"


def _long(stream: bool) -> bytes:
    return json.dumps({"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": LONG,
                       "temperature": 0, "stream": stream, "speculative": {"enabled": False},
                       "cache_prompt": False}).encode()


@pytest.mark.parametrize("running_streams", [False, True])
def test_sigterm_stops_the_running_request_answers_every_one_and_saves_the_memory(tmp_path, vocab, running_streams):
    path = tmp_path / "memory.bin"
    s = Server(FIXED_DRAFT, "--memory", str(path), "--shutdown-timeout", "1")
    answers: dict[str, tuple[int, bytes]] = {}
    try:
        chat(s.client(), [{"role": "user", "content": "Say hi."}], max_tokens=8)  # something to remember

        def send(name, body):
            answers[name] = post_raw(s.url + "/v1/completions", body, timeout=120)

        threads = [threading.Thread(target=send, args=("running", _long(running_streams)))]
        threads[0].start()
        deadline = time.monotonic() + 60
        while not json.loads(s.get("/health"))["busy"] and time.monotonic() < deadline:
            time.sleep(0.05)
        for name, stream in (("queued", False), ("queued_stream", True)):
            threads.append(threading.Thread(target=send, args=(name, _long(stream))))
            threads[-1].start()
        while json.loads(s.get("/health"))["queued"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads(s.get("/health"))["queued"] == 2
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        rc = s.proc.wait(60)
        took = time.monotonic() - t0
    finally:
        s.stop(signal.SIGKILL)
    assert not any(t.is_alive() for t in threads)
    assert rc in (0, -signal.SIGTERM) and took < 20, (rc, took)
    errors = {}
    for name in ("running", "queued", "queued_stream"):
        status, raw = answers[name]
        if name == "queued" or (name == "running" and not running_streams):
            errors[name] = json.loads(raw)["error"]
            assert status == 503, name
        else:  # a stream is 200 from its first byte: the error is its last event before [DONE]
            events = _events(raw)
            assert status == 200 and events[-1] == "[DONE]", name
            errors[name] = events[-2]["error"]
        assert errors[name]["code"] == "shutting_down" and errors[name]["type"] == "server_error", name
    # the running request had its second of grace; the queued ones were refused at once
    assert "stopped after 1 s" in errors["running"]["message"]
    assert "stopped" not in errors["queued"]["message"] and "stopped" not in errors["queued_stream"]["message"]
    log = "".join(s.log)
    assert f"memory saved to {path}" in log, log
    assert _loaded(path, vocab).n_tokens > 0


@pytest.fixture(scope="module")
def vocab() -> tuple[int, bytes]:
    """SmolLM2's vocabulary as a memory file records it: (size, fingerprint)."""
    from ngramcache import llama as nl
    from ngramcache.serving.memory import vocab_fingerprint

    backend = nl.LlamaBackend.of(nl.make_llama("smollm2", n_ctx=256))
    return backend.n_vocab, vocab_fingerprint(backend)


def _loaded(path, vocab):
    """The memory file at ``path`` as the next server would load it (a damaged one raises)."""
    from ngramcache.serving import Memory

    return Memory.load(path, *vocab)


def _sigterm(s: Server) -> tuple[int, float]:
    """SIGTERM ``s``: its exit status and the seconds it took to end."""
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    rc = s.proc.wait(60)
    return rc, time.monotonic() - t0


PROMPT_PASS = 1900  # tokens: with -b 16, a prompt pass of 119 decodes


def test_sigterm_in_the_prompt_pass_stops_it_at_its_next_batch(tmp_path, vocab):
    path = tmp_path / "memory.bin"
    # small batches: the prompt pass is many decodes, and a stop is taken between two of them;
    # no grace, so the stop comes at once rather than after the prompt pass on a fast machine
    s = Server(FIXED_DRAFT, "--memory", str(path), "--shutdown-timeout", "0", "-b", "16")
    answer = {}
    try:
        chat(s.client(), [{"role": "user", "content": "Say hi."}], max_tokens=8)  # something to remember
        body = json.dumps({"prompt": list(range(1000, 1000 + PROMPT_PASS)), "max_tokens": 8, "stream": True,
                           "cache_prompt": False, "speculative": {"enabled": False}}).encode()
        t = threading.Thread(target=lambda: answer.update(r=post_raw(s.url + "/v1/completions", body)))
        t.start()
        deadline = time.monotonic() + 60
        while not json.loads(s.get("/health"))["busy"] and time.monotonic() < deadline:
            time.sleep(0.02)
        rc, took = _sigterm(s)
        t.join(60)
    finally:
        s.stop(signal.SIGKILL)
    assert rc in (0, -signal.SIGTERM) and took < 20, (rc, took)
    status, raw = answer["r"]
    events = _events(raw)
    assert status == 200 and events[-1] == "[DONE]", events[-3:]
    err = events[-2]["error"]
    assert err["code"] == "shutting_down" and "stopped after 0 s" in err["message"], err
    # stopped inside its prompt pass: no token was decoded, so no text came
    assert all(e["choices"][0]["text"] == "" for e in events[:-2]), events
    log = "".join(s.log)
    assert f"memory saved to {path}" in log, log
    assert _loaded(path, vocab).n_tokens > 0


def test_sigterm_while_the_memory_is_saved(tmp_path, vocab):

    path = tmp_path / "memory.bin"
    s = Server(FIXED_DRAFT, "--memory", str(path), "--memory-save-interval", "0.002", "--shutdown-timeout", "1")
    statuses = []
    stop = threading.Event()

    def keep_learning():  # requests between the saves, so that each save has something new
        i = 0
        while not stop.is_set():
            i += 1
            try:
                statuses.append(post_raw(s.url + "/v1/completions",
                                          json.dumps({"prompt": f"{i} apples", "max_tokens": 4}).encode(), 60)[0])
            except OSError:  # the server stopped listening
                return

    try:
        chat(s.client(), [{"role": "user", "content": "Say hi."}], max_tokens=8)
        t = threading.Thread(target=keep_learning)
        t.start()
        deadline = time.monotonic() + 60
        saving = False
        while not saving and time.monotonic() < deadline:
            saving = save_under_way(s.proc.pid, tmp_path)
        if saving:
            rc, took = _sigterm(s)
        stop.set()
        t.join(90)
    finally:
        stop.set()
        s.stop(signal.SIGKILL)
    assert saving, "no save was seen under way"
    assert rc in (0, -signal.SIGTERM) and took < 20, (rc, took)
    assert set(statuses) <= {200, 503}, statuses
    log = "".join(s.log)
    assert f"memory saved to {path}" in log and "not saved" not in log, log
    assert _loaded(path, vocab).n_tokens > 0


def test_a_memory_file_of_another_model_is_refused_as_such(tmp_path):
    from ngramcache.serving import Memory

    path = tmp_path / "memory.bin"
    mem = Memory(max_tokens=1000, mod_size=64)
    mem.learn(np.arange(50, dtype=np.int32))
    mem.save(path, 262144, bytes(32))  # an intact file, for another vocabulary
    r = subprocess.run([sys.executable, "-m", "ngramcache", "serve", "-m", "smollm2", "--port", "0", "-c", str(SERVE_CTX),
                        "--memory", str(path), FIXED_DRAFT], capture_output=True, text=True, timeout=240)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "server memory made for another vocabulary" in r.stderr and "damaged" not in r.stderr, r.stderr


def test_a_static_table_is_checked_once_at_start(tmp_path):
    from ngramcache import StaticTable

    table = tmp_path / "corpus.ngst"
    tokens = (np.arange(20_000, dtype=np.int32) * 7919) % 5000
    StaticTable.build(tokens, 2).save(table)
    s = Server(FIXED_DRAFT, "--no-memory", "-lcs", str(table))
    try:
        r = chat(s.client(), [{"role": "user", "content": "hi"}], max_tokens=4)
        assert r.choices[0].message.content
    finally:
        s.stop()
    assert any("static table" in line and "checked in" in line for line in s.log), s.log
    data = bytearray(table.read_bytes())
    data[-100] ^= 0xFF  # inside the last section: only a whole check finds it
    table.write_bytes(bytes(data))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ngramcache", "serve", "-m", "smollm2", "--port", "0", "-lcs",
                        str(table), FIXED_DRAFT], capture_output=True, text=True, timeout=240)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "checksum" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 60
    r = subprocess.run([sys.executable, "-m", "ngramcache", "serve", "--drafter", "suffix", "-lcs", str(table)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "-lcs applies to --drafter copy or lookup" in r.stderr
