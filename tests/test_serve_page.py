"""The chat page at ``/`` in a real headless Chromium (selenium): against a small stand-in
server that sends known events (how the page reads a stream, marks drafted text and shows
errors), and against ``python -m ngramcache serve -m smollm2`` (the streamed answer is
what the API answers to the same request; drafted text is marked where drafts were
accepted). Needs Debian's ``chromium`` and ``chromium-driver``; skips without them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

import pytest

PAGE = resources.files("ngramcache").joinpath("data/chat.html").read_text(encoding="utf-8")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 180  # the longest a turn may take on a slow, shared machine


# --- the page on its own -----------------------------------------------------------------


def test_page_fetches_nothing_from_elsewhere():
    # no external scripts, styles, fonts or images: the page works offline
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", PAGE, re.I)
    assert not re.search(r"<(script|img|iframe)[^>]*\bsrc=|<link\b|@import|url\(", PAGE, re.I)
    for id_ in ("input", "send", "new", "drafter", "max-tokens", "log"):
        assert f'id="{id_}"' in PAGE


# --- a browser -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1200,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver, cond, timeout=WAIT_S):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(cond)


def _text(elem) -> str:
    # textContent, not .text: .text is the rendered text, with whitespace changed
    return elem.get_attribute("textContent")


def _turns(driver):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, "#log .turn")


def _say(driver, text: str, max_tokens: int | str | None = None, drafter: str | None = None):
    """Type ``text``, send it, and return its turn once its figures (or error) show."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    if max_tokens is not None:
        box = driver.find_element(By.ID, "max-tokens")
        box.clear()
        box.send_keys(str(max_tokens))
    if drafter is not None:
        Select(driver.find_element(By.ID, "drafter")).select_by_value(drafter)
    n = len(_turns(driver))
    driver.find_element(By.ID, "input").send_keys(text)
    driver.find_element(By.ID, "send").click()
    _wait(driver, lambda d: len(_turns(d)) == n + 1)
    turn = _turns(driver)[n]
    _wait(driver, lambda d: _text(turn.find_element(By.CSS_SELECTOR, ".figures")).strip())
    _wait(driver, lambda d: d.find_element(By.ID, "send").is_enabled())
    return turn


def _parts(turn):
    """(answer text, [drafted span texts], figures element, figures text, the request sent)."""
    from selenium.webdriver.common.by import By

    answer = turn.find_element(By.CSS_SELECTOR, ".assistant")
    spans = [_text(s) for s in answer.find_elements(By.CSS_SELECTOR, "span.drafted")]
    fig = turn.find_element(By.CSS_SELECTOR, ".figures")
    return _text(answer), spans, fig, _text(fig), json.loads(turn.get_attribute("data-request"))


def _same_origin(driver, base: str) -> list[str]:
    names = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return [n for n in names if not n.startswith(base + "/")]


# --- against a stand-in server that sends known events ------------------------------------


def _events(pieces, final=True, error=None) -> bytes:
    out = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}]
    out += [{"choices": [{"delta": {"content": t}}], "ngramcache": {"from_draft": d}} for t, d in pieces]
    if error is not None:
        out.append({"error": {"message": error, "type": "server_error"}})
    elif final:
        out.append({"choices": [{"delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29},
                    "ngramcache": {"drafter": "copy", "drafted": 7, "accepted": 5, "acceptance": 0.7143,
                                   "prompt_tokens_cached": 12, "t_total": 0.25, "tokens_per_s": 41.5}})
    lines = "".join(f"data: {json.dumps(o, ensure_ascii=False)}\n\n" for o in out)
    return (lines + ("data: [DONE]\n\n" if error is not None or final else "")).encode("utf-8")


ANSWER = [("def f():\n", False), ("    return ", True), ("'é→'\n", True), ("f()  # done", False)]


class _Fake(BaseHTTPRequestHandler):
    bodies: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/":
            self._send(200, "text/html; charset=utf-8", PAGE.encode("utf-8"))
        elif self.path == "/v1/models":
            self._send(200, "application/json", json.dumps({"data": [{"id": "stand-in"}]}).encode())
        else:
            self._send(404, "application/json", b'{"error": {"message": "not found"}}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        last = body["messages"][-1]["content"]
        if last == "refuse":
            msg = {"error": {"message": "max_tokens 100000 is too many", "type": "invalid_request_error"}}
            return self._send(400, "application/json", json.dumps(msg).encode())
        data = _events(ANSWER[:1], error="generation failed: boom") if last == "fail" else \
            _events(ANSWER, final=last != "cut")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(0, len(data), 7):  # pieces that cut lines, events and UTF-8 characters
            self.wfile.write(data[i : i + 7])
            self.wfile.flush()
            time.sleep(0.001)

    def _send(self, status, ctype, data):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def fake():
    _Fake.bodies = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(10)


def test_page_streams_and_marks_drafted_text(browser, fake):
    from selenium.webdriver.common.by import By

    browser.get(fake + "/")
    _wait(browser, lambda d: _text(d.find_element(By.ID, "model")) == "stand-in", 30)
    turn = _say(browser, "write f", max_tokens=40, drafter="suffix")
    answer, spans, fig, figures, sent = _parts(turn)
    assert answer == "".join(t for t, _ in ANSWER)
    assert spans == ["    return 'é→'\n"]  # consecutive drafted pieces make one span
    assert sent == _Fake.bodies[-1]
    assert sent == {"messages": [{"role": "user", "content": "write f"}], "stream": True, "temperature": 0,
                    "max_tokens": 40, "speculative": {"drafter": "suffix"}}
    assert (fig.get_attribute("data-tokens"), fig.get_attribute("data-accepted"),
            fig.get_attribute("data-drafted"), fig.get_attribute("data-cached"),
            fig.get_attribute("data-drafter")) == ("9", "5", "7", "12", "copy")
    for part in ("9 tokens", "41.5 tok/s", "5/7", "71.4%", "12 prompt tokens cached", "drafter copy"):
        assert part in figures

    # the next turn sends the whole conversation, with drafting off
    turn = _say(browser, "again", max_tokens="", drafter="off")
    sent = _parts(turn)[4]
    assert sent == _Fake.bodies[-1]
    assert sent["messages"] == [{"role": "user", "content": "write f"}, {"role": "assistant", "content": answer},
                                {"role": "user", "content": "again"}]
    assert sent["speculative"] == {"enabled": False} and "max_tokens" not in sent
    assert browser.execute_script("return messages.length") == 4
    assert _same_origin(browser, fake) == []

    browser.find_element(By.ID, "new").click()
    assert _turns(browser) == [] and browser.execute_script("return messages.length") == 0
    _say(browser, "hello")
    assert [m["content"] for m in _Fake.bodies[-1]["messages"]] == ["hello"]


@pytest.mark.parametrize("say, shown", [
    ("refuse", "error: max_tokens 100000 is too many"),  # a 400 with a JSON error body
    ("fail", "error: generation failed: boom"),  # an error event in the stream
    ("cut", "error: the stream ended before the answer was complete"),
])
def test_page_shows_errors(browser, fake, say, shown):
    from selenium.webdriver.common.by import By

    browser.get(fake + "/")
    _say(browser, "hello")
    turn = _say(browser, say)
    fig = turn.find_element(By.CSS_SELECTOR, ".figures")
    assert "error" in fig.get_attribute("class").split()
    assert _text(fig) == shown
    # the failed turn is not kept: the conversation goes on from the turn before it
    assert browser.execute_script("return messages.map(m => m.content)") == ["hello", _parts(_turns(browser)[0])[0]]
    _say(browser, "on")
    assert [m["content"] for m in _Fake.bodies[-1]["messages"]][-1:] == ["on"]
    assert len(_Fake.bodies[-1]["messages"]) == 3


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
    proc = subprocess.Popen([sys.executable, "-m", "ngramcache", "serve", "-m", "smollm2", "--port", "0",
                             "--no-memory"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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
    with urllib.request.urlopen(req, timeout=WAIT_S) as r:
        return json.load(r)


def _check_turn(base: str, turn) -> tuple[str, list[str], dict]:
    """The turn's answer is what the API answers to the same request, and its figures are
    the numbers the stream ended with."""
    answer, spans, fig, figures, sent = _parts(turn)
    assert "error" not in fig.get_attribute("class").split(), figures
    assert answer.strip()
    assert sent["stream"] is True
    direct = _post(base, {**sent, "stream": False})
    assert answer == direct["choices"][0]["message"]["content"]
    data = {k: fig.get_attribute(f"data-{k}") for k in ("tokens", "accepted", "drafted", "cached", "drafter")}
    assert int(data["tokens"]) == direct["usage"]["completion_tokens"] > 0
    assert data["drafter"] == sent["speculative"].get("drafter", "off")
    assert f"{data['tokens']} tokens" in figures
    assert re.search(r"\d+(\.\d+)? tok/s", figures)
    assert f"acceptance {data['accepted']}/{data['drafted']}" in figures
    assert f"{data['cached']} prompt tokens cached" in figures
    figs = {k: int(v) for k, v in data.items() if k != "drafter"}
    # text from accepted drafts is marked, and only then
    assert bool(spans) == (figs["accepted"] > 0)
    assert all(s for s in spans) and len("".join(spans)) <= len(answer)
    return answer, spans, figs


CLASS = "Write a small Python class Point with x and y and a method distance(other). Only the code."
AGAIN = "Add a method __repr__ to Point and write out the full class again."


@pytest.mark.model
def test_chat_with_the_model(browser, server):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    _wait(browser, lambda d: _text(d.find_element(By.ID, "model")) == "smollm2", 30)
    first, _, _ = _check_turn(server, _say(browser, CLASS, max_tokens=80, drafter="copy"))
    turn = _say(browser, AGAIN)
    second, spans, figs = _check_turn(server, turn)
    assert _parts(turn)[4]["messages"] == [{"role": "user", "content": CLASS},
                                           {"role": "assistant", "content": first},
                                           {"role": "user", "content": AGAIN}]
    # the second answer repeats code from the first: the copy drafter finds it
    assert figs["accepted"] > 0 and spans
    assert figs["cached"] > 0  # the second turn reuses the first one's prompt in the KV cache
    assert _same_origin(browser, server) == []


@pytest.mark.model
def test_errors_from_the_model_server(browser, server):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    turn = _say(browser, "Hello!", max_tokens=100000)
    fig = turn.find_element(By.CSS_SELECTOR, ".figures")
    assert "error" in fig.get_attribute("class").split()
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(server, {**_parts(turn)[4], "stream": False})
    with e.value:
        assert e.value.code == 400
        message = json.load(e.value)["error"]["message"]
    assert "exceed the context" in message
    assert _text(fig) == "error: " + message
    assert browser.execute_script("return messages.length") == 0


def _counter(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"ngramcache_{name}_total "):
                return float(line.split()[1])
    raise AssertionError(f"/metrics has no ngramcache_{name}_total")


@pytest.mark.model
def test_new_conversation_stops_the_answer(browser, server):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    before = _counter(server, "cancelled")
    box = browser.find_element(By.ID, "max-tokens")
    box.clear()
    box.send_keys("2000")
    browser.find_element(By.ID, "input").send_keys("Write a long story about a cat who learns to sail.")
    browser.find_element(By.ID, "send").click()
    _wait(browser, lambda d: _text(d.find_element(By.CSS_SELECTOR, ".assistant")).strip())
    browser.find_element(By.ID, "new").click()
    assert _turns(browser) == [] and browser.execute_script("return messages.length") == 0
    # the page dropped the stream; the server stops generating for it
    _wait(browser, lambda d: _counter(server, "cancelled") == before + 1, 60)
    _wait(browser, lambda d: _health(server)["busy"] is False, 30)


def _health(base: str) -> dict:
    with urllib.request.urlopen(base + "/health", timeout=30) as r:
        return json.load(r)
