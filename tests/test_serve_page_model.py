"""The chat page against ``python -m ngramcache serve -m smollm2`` in a real headless
Chromium: the streamed answer is what the API answers to the same request, its figures are
the numbers the stream ended with, drafted text is marked where drafts were accepted, a
refused request is taken back, and stopping (the stop button, a new chat) cancels the job
on the server. The page against known events: tests/test_serve_page.py."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

import page_driver as pd
from page_driver import browser  # noqa: F401 - the fixture

# --- against the real server and model --------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("llama_cpp")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from ngramcache.models import default_model_path

    try:
        default_model_path("smollm2")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    # --fixed-draft: no measuring of verification costs at start (minutes on a busy machine);
    # the page shows whatever draft lengths the server picks
    proc = subprocess.Popen([sys.executable, "-m", "ngramcache", "serve", "-m", "smollm2", "--port", "0",
                             "--no-memory", "--fixed-draft"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    lines: list[str] = []
    ready = threading.Event()
    found: list[str] = []

    def read():
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"ngramcache serve: \S+ on (http://[\d.]+:\d+)", line)
            if m and not found:
                found.append(m.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        ready.wait(300)
        if not found:
            raise AssertionError(f"the server did not start (exit code {proc.poll()}):\n{''.join(lines)}")
        yield found[0]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        reader.join(10)
        proc.stderr.close()


def _post(base: str, body: dict) -> dict:
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=pd.WAIT_S) as r:
        return json.load(r)


def _check_turn(base: str, turn) -> tuple[str, list[str], dict]:
    """The turn's answer is what the API answers to the same request, its figures are the
    numbers the stream ended with, and a token limit reached is said."""
    answer, spans, fig, figures, sent = pd.parts(turn)
    assert turn.get_attribute("data-state") in ("done", "length"), pd.notice(turn)
    assert answer.strip()
    assert sent["stream"] is True
    direct = _post(base, {**sent, "stream": False})
    assert answer == direct["choices"][0]["message"]["content"]
    limited = direct["choices"][0]["finish_reason"] == "length"
    assert (turn.get_attribute("data-state") == "length") == limited
    assert (pd.notice(turn) is not None and "token limit" in pd.notice(turn)[1]) == limited
    data = {k: fig.get_attribute(f"data-{k}") for k in ("tokens", "accepted", "drafted", "cached", "drafter")}
    assert int(data["tokens"]) == direct["usage"]["completion_tokens"] > 0
    assert data["drafter"] == sent["speculative"].get("drafter", "off")
    assert f"{data['tokens']} tokens" in figures
    assert re.search(r"\d+(\.\d+)? tok/s", figures)
    figs = {k: int(v) for k, v in data.items() if k != "drafter"}
    assert (f"accepted {figs['accepted']}/{figs['drafted']} drafted" if figs["drafted"] else "nothing drafted") in figures
    assert f"{data['cached']} prompt tokens cached" in figures
    # text from accepted drafts is marked, and only then; fences become code blocks
    assert bool(spans) == (figs["accepted"] > 0)
    assert all(s for s in spans) and len("".join(spans)) <= len(answer)
    rendered = pd.text_of(pd.find(turn, ".assistant"))
    assert ("```" in answer) == bool(pd.find_all(turn, ".assistant .code")) and "```" not in rendered
    return answer, spans, figs


CLASS = "Write a small Python class Point with x and y and a method distance(other). Only the code."
AGAIN = "Add a method __repr__ to Point and write out the full class again."
STORY = "Write a long story about a cat who learns to sail."


@pytest.mark.model
def test_chat_with_the_model(browser, server):
    pd.open_page(browser, server, "smollm2")
    first, _, _ = _check_turn(server, pd.say(browser, CLASS, max_tokens=80, drafter="copy"))
    turn = pd.say(browser, AGAIN)
    second, spans, figs = _check_turn(server, turn)
    assert pd.parts(turn)[4]["messages"] == [{"role": "user", "content": CLASS},
                                           {"role": "assistant", "content": first},
                                           {"role": "user", "content": AGAIN}]
    # the second answer repeats code from the first: the copy drafter finds it
    assert figs["accepted"] > 0 and spans
    assert figs["cached"] > 0  # the second turn reuses the first one's prompt in the KV cache
    assert pd.other_origins(browser, server) == []


@pytest.mark.model
def test_errors_from_the_model_server(browser, server):
    pd.open_page(browser, server, "smollm2")
    assert pd.say(browser, "Hello!", max_tokens=100000) is None
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(server, {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 100000})
    with e.value:
        assert e.value.code == 400
        message = json.load(e.value)["error"]["message"]
    assert "exceed the context" in message
    assert pd.text_of(pd.find(browser, "#error")) == "error: " + message
    assert pd.find(browser, "#input").get_attribute("value") == "Hello!"
    assert pd.turns(browser) == [] and pd.history(browser) == []


@pytest.mark.model
def test_the_icon_is_also_at_favicon_ico(browser, server):
    # the page carries its icon inline; a browser showing /health or /metrics asks for
    # /favicon.ico instead, and gets the same icon, not a 404
    pd.open_page(browser, server, "smollm2")
    inline = pd.js(browser, "document.querySelector('link[rel=icon]').href")
    with urllib.request.urlopen(server + "/favicon.ico", timeout=30) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "image/svg+xml"
        icon = r.read()
    assert inline == "data:image/svg+xml;base64," + base64.b64encode(icon).decode()
    assert icon.startswith(b"<svg ")
    browser.get_log("browser")  # forget what earlier tests left
    browser.get(server + "/health")
    time.sleep(1)  # the icon is asked for after the page has loaded
    assert pd.console_errors(browser) == []


def _counter(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"ngramcache_{name}_total "):
                return float(line.split()[1])
    raise AssertionError(f"/metrics has no ngramcache_{name}_total")


def _health(base: str) -> dict:
    with urllib.request.urlopen(base + "/health", timeout=30) as r:
        return json.load(r)


@pytest.mark.model
@pytest.mark.parametrize("button", ["stop", "new"])
def test_stopping_cancels_the_answer(browser, server, button):
    pd.open_page(browser, server, "smollm2")
    before = _counter(server, "cancelled")
    n = pd.type_message(browser, STORY, max_tokens=2000)
    turn = pd.turns(browser)[n]
    pd.wait(browser, lambda d: (pd.find(turn, ".assistant").get_attribute("data-markdown") or "").strip())
    pd.find(browser, "#" + button).click()
    pd.wait(browser, lambda d: pd.js(d, "busy === null"), 30)
    if button == "stop":  # what came is kept, marked, and is the conversation
        assert turn.get_attribute("data-state") == "stopped" and pd.notice(turn)[0] == "notice stopped"
        kept = pd.find(turn, ".assistant").get_attribute("data-markdown")
        assert kept.strip() and pd.history(browser) == ["user: " + STORY, "assistant: " + kept]
    else:  # a new chat drops it
        assert pd.turns(browser) == [] and pd.history(browser) == []
    # the page dropped the stream; the server stops generating for it
    pd.wait(browser, lambda d: _counter(server, "cancelled") == before + 1, 60)
    pd.wait(browser, lambda d: _health(server)["busy"] is False, 30)
