"""`ngramcache serve` as users meet it: a real server process on 127.0.0.1, a real model
(SmolLM2-135M-Instruct), the official ``openai`` client. Answers are checked against
``ngramcache.integrations.llama.generate`` with the same drafter; concurrent clients (some going away
mid-stream) against the same requests served alone; SIGTERM and SIGKILL during a save
against the memory file."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from support import SERVE_CTX, Server, chat, rss_kb, save_under_way

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.model

CODE_TURN = "Write a small Python class Stack with push and pop methods. Only the code."
EDIT_TURN = "Add a peek method and a __len__ method. Give the full updated code."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # fixed drafts: the adaptive gate's cost measurement (minutes on a loaded machine, and not
    # kept when its timings are noisy) would delay every start; the engine's gate is tested
    # on a fake model (test_serving.py)
    s = Server("--no-memory", "--fixed-draft")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def llm():
    from ngramcache import llama as nl

    return nl.make_llama("smollm2", n_ctx=SERVE_CTX)


def _reference(llm, messages, drafter: str | None, max_tokens: int) -> str:
    """The same request through ngramcache.integrations.llama.generate: the template and the
    drafter as the server (with --fixed-draft) builds them."""
    from ngramcache import llama as nl
    from ngramcache.drafters.catalog import make_drafter
    from ngramcache.serving.engine import ChatTemplate

    template = ChatTemplate.of(llm)
    prompt = template.render(messages)
    add_bos = not (template.bos_token and prompt.startswith(template.bos_token))
    tokens = np.asarray(llm.tokenize(prompt.encode(), add_bos=add_bos, special=True), dtype=np.int32)
    d = None
    if drafter is not None:
        d = make_drafter(drafter, n_draft=16)
    r = nl.generate(llm, tokens, d, max_tokens)
    backend = nl.LlamaBackend.of(llm)
    text = b"".join(backend.piece(int(t)) for t in r.tokens if not backend.is_eog(int(t)))
    return text.decode("utf-8", errors="replace")


def test_models_health_metrics(server):
    c = server.client()
    assert [m.id for m in c.models.list()] == ["smollm2"]
    assert c.models.retrieve("smollm2").id == "smollm2"
    health = json.loads(server.get("/health"))
    assert health["status"] == "ok" and health["model"] == "smollm2"
    text = server.get("/metrics")
    for name in ("ngramcache_requests_total", "ngramcache_tokens_total", "ngramcache_drafted_total",
                 "ngramcache_accepted_total", "ngramcache_acceptance", "ngramcache_prompt_seconds_total",
                 "ngramcache_draft_seconds_total", "ngramcache_verify_seconds_total",
                 "ngramcache_total_seconds_total"):
        assert re.search(rf"^{name} ", text, re.M), name


@pytest.mark.parametrize("drafter", ["copy", "suffix", "mod", None])
def test_chat_answers_equal_generate_with_the_same_drafter(server, llm, drafter):
    c = server.client()
    messages = [{"role": "user", "content": CODE_TURN}]
    spec = {"drafter": drafter} if drafter else {"enabled": False}
    r = chat(c, messages, max_tokens=80, extra_body={"speculative": spec, "cache_prompt": False})
    text = r.choices[0].message.content
    assert text == _reference(llm, messages, drafter, 80)
    assert r.usage.completion_tokens == 80 or r.choices[0].finish_reason == "stop"
    fig = r.model_extra["ngramcache"]
    assert fig["drafter"] == drafter
    assert 0 <= fig["accepted"] <= fig["drafted"]
    if drafter is None:
        assert fig["drafted"] == 0


def test_streaming_gives_the_same_text_and_marks_drafts(server):
    c = server.client()
    first = [{"role": "user", "content": CODE_TURN}]
    a1 = chat(c, first, max_tokens=80, extra_body={"cache_prompt": False}).choices[0].message.content
    messages = first + [{"role": "assistant", "content": a1}, {"role": "user", "content": EDIT_TURN}]
    whole = chat(c, messages, max_tokens=100, extra_body={"cache_prompt": False})
    pieces, drafted, final = [], [], None
    stream = chat(c, messages, max_tokens=100, stream=True, extra_body={"cache_prompt": False})
    for chunk in stream:
        extra = chunk.model_extra.get("ngramcache") or {}
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            drafted.append(extra["from_draft"])
        if chunk.choices and chunk.choices[0].finish_reason:
            final = chunk
    assert "".join(pieces) == whole.choices[0].message.content
    assert final is not None and final.choices[0].finish_reason == whole.choices[0].finish_reason
    fig = final.model_extra["ngramcache"]
    # the edit repeats the class: drafts are accepted, and the chunks say which text they made
    assert fig["accepted"] > 0
    assert any(drafted) == (fig["accepted"] > 0)


def test_completion_text_and_token_prompts_and_stop(server):
    c = server.client()
    r = c.completions.create(model="smollm2", prompt="def fibonacci(n):", max_tokens=24, temperature=0)
    text = r.choices[0].text
    assert text and r.usage.completion_tokens == 24 and r.choices[0].finish_reason == "length"
    status, body = server.post("/v1/completions", json.dumps({"prompt": [1, 2, 3, 4], "max_tokens": 4}).encode())
    assert status == 200 and body["usage"]["prompt_tokens"] == 4
    r = c.completions.create(model="smollm2", prompt="def fibonacci(n):", max_tokens=24, temperature=0, stop=["\n"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text.split("\n")[0]
    r = c.completions.create(model="smollm2", prompt="def fibonacci(n):", max_tokens=0)
    assert r.choices[0].text == "" and r.usage.completion_tokens == 0


def test_prompt_cache_serves_the_next_turn_from_the_kv_cache(server):
    c = server.client()
    first = [{"role": "user", "content": CODE_TURN}]
    r1 = chat(c, first, max_tokens=60)
    messages = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                        {"role": "user", "content": EDIT_TURN}]
    r2 = chat(c, messages, max_tokens=20)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    # everything up to the end of the first answer is in the KV cache
    assert r1.usage.prompt_tokens + r1.usage.completion_tokens - 2 <= cached < r2.usage.prompt_tokens
    assert r2.model_extra["ngramcache"]["prompt_tokens_cached"] == cached


@pytest.mark.parametrize("body,status,param", [
    ({"model": "gpt-nope", "prompt": "x", "max_tokens": 2}, 404, "model"),
    ({"prompt": "x", "max_tokens": 100000}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": -1}, 422, "max_tokens"),
    ({"prompt": "x", "max_tokens": "ten"}, 422, "max_tokens"),
    ({"prompt": 5}, 422, None),
    ({"max_tokens": 3}, 422, "prompt"),
    ({"prompt": "", "max_tokens": 3}, 400, "prompt"),
    ({"prompt": [1, 2, 10**9], "max_tokens": 3}, 400, "prompt"),
    ({"prompt": [1, -2], "max_tokens": 3}, 400, "prompt"),
    ({"prompt": "x", "n": 2}, 422, "n"),
    ({"prompt": "x", "speculative": {"drafter": "nope"}}, 400, "speculative.drafter"),
    ({"prompt": "x", "speculative": {"n_draft": 1000}}, 400, "speculative.n_draft"),
    ({"prompt": "x", "speculative": {"colour": "red"}}, 400, "speculative.colour"),
    ({"prompt": "x", "speculative": "copy"}, 422, "speculative"),
    ({"prompt": "x", "speculative": {"drafter": "suffix", "options": {"max_depth": 0}}}, 400,
     "speculative.options.max_depth"),
    ({"prompt": "x", "temperature": -1}, 422, "temperature"),
])
def test_bad_completion_requests_get_openai_errors(server, body, status, param):
    got, err = server.post("/v1/completions", json.dumps(body).encode())
    assert got == status, err
    assert set(err["error"]) == {"message", "type", "param", "code"} and err["error"]["message"]
    if param is not None:
        assert err["error"]["param"].startswith(param)


def test_bad_json_and_chat_errors(server):
    for raw in (b"{not json", b"", b"[1, 2"):
        status, err = server.post("/v1/chat/completions", raw)
        assert status in (400, 422) and err["error"]["message"]
    status, err = server.post("/v1/chat/completions", b"{not json")
    assert status == 400 and err["error"]["code"] == "invalid_json"
    status, err = server.post("/v1/chat/completions", json.dumps({"messages": []}).encode())
    assert status == 422
    status, err = server.post("/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode())
    assert status == 422
    c = server.client()
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="context") as e:
        chat(c, [{"role": "user", "content": "hi"}], max_tokens=SERVE_CTX)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "max_tokens"
    # the server still answers after every error
    assert chat(c, [{"role": "user", "content": "hi"}], max_tokens=3).usage.completion_tokens <= 3


def _served_alone(server, requests):
    c = server.client()
    out = []
    for kind, messages, spec in requests:
        r = chat(c, messages, max_tokens=16, extra_body={"speculative": spec, "cache_prompt": False})
        out.append(r.choices[0].message.content)
    return out


def test_load_16_clients_8_requests_some_cancelled(server):
    topics = ["a stack", "a queue", "binary search", "a linked list", "bubble sort", "a counter", "fizzbuzz",
              "a timer"]
    drafters = [{"drafter": "copy"}, {"drafter": "suffix"}, {"enabled": False}, {"drafter": "mod"}]
    requests = [("chat", [{"role": "user", "content": f"Write Python code for {t}."}], drafters[i % 4])
                for i, t in enumerate(topics)]
    alone = _served_alone(server, requests)
    cancelled_before = server.metric("ngramcache_cancelled_total")
    rss_before = rss_kb(server.proc.pid)
    results: dict[tuple[int, int], str] = {}
    errors: list[str] = []
    n_cancel = 0
    lock = threading.Lock()

    def client(ci: int):
        nonlocal n_cancel
        # a request may wait behind the other 15 clients' (one decode at a time): on a loaded
        # machine that is minutes, and what is tested is that each is answered, not how fast
        c = server.client(timeout=1500)
        for j in range(8):
            k = (ci + j) % len(requests)
            _, messages, spec = requests[k]
            mode = (ci * 8 + j) % 4  # 0, 1: whole answers; 2: streamed; 3: streamed and cancelled
            try:
                kw = dict(max_tokens=16, extra_body={"speculative": spec, "cache_prompt": False})
                if mode < 2:
                    results[(ci, j)] = chat(c, messages, **kw).choices[0].message.content
                else:
                    with chat(c, messages, stream=True, **kw) as s:
                        parts = []
                        for i, chunk in enumerate(s):
                            if chunk.choices and chunk.choices[0].delta.content:
                                parts.append(chunk.choices[0].delta.content)
                            if mode == 3 and i == 2:
                                break
                    if mode == 3:
                        with lock:
                            n_cancel += 1
                    else:
                        results[(ci, j)] = "".join(parts)
            except Exception as e:  # every non-cancelled request must be answered
                errors.append(f"client {ci} request {j}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, 3000 - (time.monotonic() - t0)))
    assert not any(t.is_alive() for t in threads), "a client is stuck"
    assert not errors, errors
    assert len(results) == 16 * 8 - n_cancel and n_cancel == 32
    for (ci, j), text in results.items():
        assert text == alone[(ci + j) % len(requests)], (ci, j)
    # no worker stuck: the queue drains and the model is free again
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        h = json.loads(server.get("/health"))
        if h["queued"] == 0 and not h["busy"]:
            break
        time.sleep(0.2)
    assert h["queued"] == 0 and not h["busy"]
    # streams that went away stopped their requests (most of them before the end)
    assert server.metric("ngramcache_cancelled_total") - cancelled_before >= 1
    assert rss_kb(server.proc.pid) - rss_before < 200_000, "the server grew by more than 200 MB"
    print(f"load test: {16 * 8} requests in {time.monotonic() - t0:.1f} s")


def _memory_server(path: Path, *flags: str) -> Server:
    # no adaptive gate: its cost measurement would only delay each of these starts
    return Server("--memory", str(path), "--memory-tokens", "1500", "--fixed-draft", *flags)


def test_memory_is_learned_bounded_saved_at_sigterm_and_loaded(tmp_path):
    path = tmp_path / "memory.bin"
    s = _memory_server(path)
    try:
        c = s.client()
        for t in ["a stack", "a queue", "a heap", "a set", "a trie", "a graph", "a deque", "a map"]:
            chat(c, [{"role": "user", "content": f"Write a Python class for {t}, with docstrings."}], max_tokens=120)
        tokens = s.metric("ngramcache_memory_tokens")
        assert 0 < tokens <= 1500
    finally:
        # uvicorn shuts down, then ends the process with the signal it caught
        assert s.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    assert path.exists()
    s2 = _memory_server(path)
    try:
        assert s2.metric("ngramcache_memory_tokens") == tokens
    finally:
        s2.stop()
    path.write_bytes(b"NGSRVMEM garbage")
    s3 = subprocess.run([sys.executable, "-m", "ngramcache", "serve", "-m", "smollm2", "--port", "0",
                         "--memory", str(path)], capture_output=True, text=True, timeout=240)
    assert s3.returncode == 1 and "memory" in s3.stderr and "Traceback" not in s3.stderr


def test_sigkill_while_saving_keeps_the_previous_memory_file(tmp_path):
    path = tmp_path / "memory.bin"
    s = _memory_server(path, "--memory-save-interval", "0.002")  # saves between requests, often
    try:
        c = s.client()
        chat(c, [{"role": "user", "content": "Write a Python class Stack."}], max_tokens=40)
        deadline = time.monotonic() + 60
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.exists()
        # keep it saving; kill it the moment a temporary file shows that a save is under way
        stop = threading.Event()

        def keep_busy():
            while not stop.is_set():
                try:
                    chat(c, [{"role": "user", "content": "Write a Python class Queue."}], max_tokens=8)
                except Exception:
                    return

        t = threading.Thread(target=keep_busy, daemon=True)
        t.start()
        deadline = time.monotonic() + 60
        killed = False
        while time.monotonic() < deadline and not killed:
            if save_under_way(s.proc.pid, tmp_path):
                s.proc.kill()
                killed = True
        stop.set()
        assert killed, "no save was seen under way"
        s.proc.wait(30)
    finally:
        s.stop(signal.SIGKILL)
    # the file is a whole memory file (one of the saves, never half of one): the server loads it
    data = path.read_bytes()
    assert data.startswith(b"NGSRVMEM")
    s2 = _memory_server(path)
    try:
        assert s2.metric("ngramcache_memory_tokens") > 0
    finally:
        s2.stop()
