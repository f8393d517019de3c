"""The chat page at ``/`` in a real headless Chromium (selenium), against a small stand-in
server that sends known events: Markdown rendering (text, never HTML), drafted text marked
by whole tokens, an open fence while streaming, stopping, notices for the token limit and
errors, turns that fail before any text taken back, the figures' legend, the highlighting
switch, the empty page, the favicon and a clean console, and the layout on a desktop and a
phone. The same page against the real server and model: tests/test_serve_page_model.py."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

import pytest

import page_driver as pd
from page_driver import browser  # noqa: F401 - the fixture

PAGE = resources.files("ngramcache").joinpath("data/chat.html").read_text(encoding="utf-8")


# --- the page on its own -----------------------------------------------------------------


def test_page_fetches_nothing_from_elsewhere():
    # no external scripts, styles, fonts or images: the page works offline
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", PAGE, re.I)
    assert not re.search(r"<(script|img|iframe)[^>]*\bsrc=|@import|url\(|innerHTML|insertAdjacentHTML", PAGE, re.I)
    links = re.findall(r"<link\b[^>]*>", PAGE, re.I)
    assert links and all(re.search(r'\bhref="data:', link) for link in links)  # the favicon, inline
    for id_ in ("input", "send", "stop", "new", "drafter", "max-tokens", "highlight", "log", "empty", "error"):
        assert f'id="{id_}"' in PAGE


# --- against a stand-in server that sends known events ------------------------------------

F, T = False, True
# (piece, from_draft) as the server streams them: one piece per run of tokens, a token's
# leading space with it, Markdown markup inside drafted pieces
ANSWER = [("## Plan", F), ("\n\n", F), ("Here", F), (" is", F), (" a", T), (" **", T), ("fast", T), ("**", F),
          (" function", T), (" with", F), (" `add`", F), (" and", F), (" *one*", F), (" __init__", F), (" [link](https://example.org/a)", F),
          (" and", F), (" [bad](javascript:alert(1))", F), (":\n\n", F), ("```", F), ("python", F), ("\n", F),
          ("def", F), (" add", T), ("(a", T), (", b", T), ("):\n", F), ("    return", T), (" a", T), (" +", F),
          (" b", F), ("\n```", F), ("\n\n", F), ("-", F), (" one", T), ("\n", F), ("- two", F), ("\n\n", F),
          ("1", F), (". first", F), ("\n2. second", F)]
MARKDOWN = "".join(t for t, _ in ANSWER)
SPANS = [" a ", "fast", " function", " add(a, b", "    return a", "one"]  # whole tokens, neighbours merged; markup not shown
XSS = [("<script>window.pwned = 1</script> and <img src=x onerror=\"window.pwned = 2\">", F),
       (" `<img src=x onerror=\"window.pwned = 3\">`", T), (" [x](javascript:window.pwned=4)\n\n", F),
       ("```html\n<script>window.pwned = 5</script>\n```", F)]
LONG = [("# A long answer\n\n", F)] + [(f"Paragraph {i} with words that wrap on a phone, a Verylongwordwithoutanyspaces"
                                        f"{'x' * 60} and **bold** text.\n\n", i % 2 == 1) for i in range(8)] + \
       [("| planet | moons | note |\n|---|---:|:---|\n| Earth | 1 | home |\n| Mars | 2 | red |\n\n", F),
        ("```python\nprint('" + "a very long line of code " * 8 + "')\n```\n", T)]
FIGURES = {"drafter": "copy", "drafted": 7, "accepted": 5, "acceptance": 0.7143, "prompt_tokens_cached": 12,
           "t_total": 0.25, "tokens_per_s": 41.5}


def _events(pieces, end="stop", error=None, figures=None, first=True) -> bytes:
    out = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}] if first else []
    out += [{"choices": [{"delta": {"content": t}}], "ngramcache": {"from_draft": d}} for t, d in pieces]
    if error is not None:
        out.append({"error": {"message": error, "type": "server_error"}})
    elif end is not None:
        out.append({"choices": [{"delta": {}, "finish_reason": end}],
                    "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29},
                    "ngramcache": {**FIGURES, **(figures or {})}})
    lines = "".join(f"data: {json.dumps(o, ensure_ascii=False)}\n\n" for o in out)
    return (lines + ("data: [DONE]\n\n" if error is not None or end is not None else "")).encode("utf-8")


HELD = [("Here:\n\n", F), ("```python\n", F), ("def f():\n", T)]  # an open fence, then the stream waits
REPLIES = {
    "fail": lambda: _events(ANSWER[:4], error="generation failed: boom"),
    "fail early": lambda: _events([], error="the model is gone"),
    "cut": lambda: _events(ANSWER, end=None),
    "long": lambda: _events(ANSWER[:4], end="length"),
    "plain": lambda: _events(ANSWER[:4], figures={"drafted": 0, "accepted": 0, "acceptance": 0.0}),
    "xss": lambda: _events(XSS),
    "tall": lambda: _events(LONG),
}


class _Fake(BaseHTTPRequestHandler):
    bodies: list = []
    release = threading.Event()  # lets a held stream ("gate") go on
    disconnects = 0  # held streams ("hold") whose client went away
    key: str | None = None  # the API key the stand-in asks for, as serve --api-key-file does
    keys_seen: list = []  # the Authorization header of each API call

    def log_message(self, *args):
        pass

    def _refused(self) -> bool:
        """Answer 401 when the stand-in has a key and the call does not carry it."""
        if self.path == "/":
            return False
        self.keys_seen.append(self.headers.get("Authorization"))
        if _Fake.key is None or self.headers.get("Authorization") == f"Bearer {_Fake.key}":
            return False
        if self.command == "POST":
            self.rfile.read(int(self.headers["Content-Length"]))
        msg = {"error": {"message": "no API key was given", "type": "invalid_request_error", "param": None,
                         "code": "invalid_api_key"}}
        self._send(401, "application/json", json.dumps(msg).encode())
        return True

    def do_GET(self):
        if self._refused():
            return
        if self.path == "/":
            self._send(200, "text/html; charset=utf-8", PAGE.encode("utf-8"))
        elif self.path == "/v1/models":
            self._send(200, "application/json", json.dumps({"data": [{"id": "stand-in"}]}).encode())
        else:
            self._send(404, "application/json", b'{"error": {"message": "not found"}}')

    def do_POST(self):
        if self._refused():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        last = body["messages"][-1]["content"]
        if last == "refuse":
            msg = {"error": {"message": "max_tokens 100000 is too many", "type": "invalid_request_error"}}
            return self._send(400, "application/json", json.dumps(msg).encode())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if last in ("gate", "hold"):
            self._write(_events(HELD, end=None))
            try:
                if last == "gate":
                    _Fake.release.wait(60)
                    return self._write(_events([("    return 1\n```\nDone.", F)], first=False))
                for _ in range(1200):  # until the page lets go of the stream
                    time.sleep(0.05)
                    self.wfile.write(b": still thinking\n\n")
                    self.wfile.flush()
            except OSError:
                _Fake.disconnects += 1
            return
        self._write(REPLIES.get(last, lambda: _events(ANSWER))())

    def _write(self, data):
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
        _Fake.release.set()
        srv.shutdown()
        srv.server_close()
        t.join(10)


def test_page_streams_and_marks_drafted_text(browser, fake):
    pd.open_page(browser, fake, "stand-in")
    turn = pd.say(browser, "write f", max_tokens=40, drafter="suffix")
    markdown, spans, fig, figures, sent = pd.parts(turn)
    assert markdown == MARKDOWN and turn.get_attribute("data-state") == "done" and pd.notice(turn) is None
    assert spans == SPANS
    assert sent == _Fake.bodies[-1]
    assert sent == {"messages": [{"role": "user", "content": "write f"}], "stream": True, "temperature": 0,
                    "max_tokens": 40, "speculative": {"drafter": "suffix"}}
    assert (fig.get_attribute("data-tokens"), fig.get_attribute("data-accepted"),
            fig.get_attribute("data-drafted"), fig.get_attribute("data-cached"),
            fig.get_attribute("data-drafter")) == ("9", "5", "7", "12", "copy")
    for part in ("9 tokens", "41.5 tok/s", "accepted 5/7 drafted (71.4%)", "12 prompt tokens cached", "drafter copy"):
        assert part in figures

    # the next turn sends the whole conversation, with drafting off
    turn = pd.say(browser, "again", max_tokens="", drafter="off")
    sent = pd.parts(turn)[4]
    assert sent == _Fake.bodies[-1]
    assert sent["messages"] == [{"role": "user", "content": "write f"}, {"role": "assistant", "content": MARKDOWN},
                                {"role": "user", "content": "again"}]
    assert sent["speculative"] == {"enabled": False} and "max_tokens" not in sent
    assert len(pd.history(browser)) == 4
    assert pd.other_origins(browser, fake) == []

    pd.find(browser, "#new").click()
    assert pd.turns(browser) == [] and pd.history(browser) == []
    pd.say(browser, "hello")
    assert [m["content"] for m in _Fake.bodies[-1]["messages"]] == ["hello"]


def test_markdown_is_rendered(browser, fake):
    pd.open_page(browser, fake, "stand-in")
    answer = pd.find(pd.say(browser, "write f"), ".assistant")
    assert [pd.text_of(h) for h in pd.find_all(answer, "h2")] == ["Plan"]
    assert [pd.text_of(e) for e in pd.find_all(answer, "p strong")] == ["fast"]
    assert [pd.text_of(e) for e in pd.find_all(answer, "p em")] == ["one"]
    assert " __init__ " in pd.text_of(pd.find(answer, "p"))  # a Python name, not bold "init"
    assert [pd.text_of(e) for e in pd.find_all(answer, "p > code")] == ["add"]
    links = pd.find_all(answer, "a")
    assert [(pd.text_of(a), a.get_attribute("href")) for a in links] == [("link", "https://example.org/a")]
    assert links[0].get_attribute("rel") == "noopener noreferrer"
    assert "and bad:" in pd.text_of(pd.find(answer, "p")) and "javascript" not in pd.text_of(answer)  # an unsafe link: its text only
    assert pd.text_of(pd.find(answer, ".code .lang")) == "python"
    assert pd.text_of(pd.find(answer, ".code pre code")) == "def add(a, b):\n    return a + b"
    assert [pd.text_of(e) for e in pd.find_all(answer, "ul > li")] == ["one", "two"]
    assert [pd.text_of(e) for e in pd.find_all(answer, "ol > li")] == ["first", "second"]
    assert "```" not in pd.text_of(answer) and "**" not in pd.text_of(answer) and "## " not in pd.text_of(answer)
    # prose in a proportional font, code in a monospace one
    fonts = [pd.js(browser, "getComputedStyle(arguments[0]).fontFamily", pd.find(answer, css)) for css in ("p", "pre code")]
    assert "mono" not in fonts[0].lower() and "mono" in fonts[1].lower()


CODE_BAR = '<div class="code-bar"><span class="lang">{}</span><button class="copy" type="button">copy</button></div>'


@pytest.mark.parametrize("markdown, html", [
    ("a snake_case name, 2 * 3 * 4, ***both***, ~~gone~~, \\*kept\\*, **open",
     "<p>a snake_case name, 2 * 3 * 4, <strong><em>both</em></strong>, <del>gone</del>, *kept*, **open</p>"),
    ("# Title #\n#tag\nline\n---", "<h1>Title</h1><p>#tag\nline</p><hr>"),
    ("3. three\n4. four\n\n- a\n  - nested\n- b",
     '<ol start="3"><li><p>three</p></li><li><p>four</p></li></ol>'
     "<ul><li><p>a</p><ul><li><p>nested</p></li></ul></li><li><p>b</p></li></ul>"),
    ("1. Run:\n   ```sh\n   ls\n   ```\n2. Next",
     f"<ol><li><p>Run:</p><div class=\"code\">{CODE_BAR.format('sh')}<pre><code>ls</code></pre></div></li>"
     "<li><p>Next</p></li></ol>"),
    ("> quoted **b**\n\nafter", "<blockquote><p>quoted <strong>b</strong></p></blockquote><p>after</p>"),
    ("| a | `x|y` |\n|:--|--:|\n| 1 |", '<div class="table"><table><thead><tr><th style="text-align: left;">a</th>'
     '<th style="text-align: right;"><code>x|y</code></th></tr></thead><tbody><tr><td style="text-align: left;">1</td>'
     '<td style="text-align: right;"></td></tr></tbody></table></div>'),
    ("~~~\n``` inside\n~~~", f"<div class=\"code\">{CODE_BAR.format('code')}<pre><code>``` inside</code></pre></div>"),
    ("``a ` b`` and `open", "<p><code>a ` b</code> and `open</p>"),
    ("[t](mailto:a@b.c) ![pic](x.png) [j](JavaScript:alert(1))",
     '<p><a href="mailto:a@b.c" title="mailto:a@b.c" target="_blank" rel="noopener noreferrer">t</a> '
     "<span>pic</span> <span>j</span></p>"),
])
def test_markdown_cases(browser, fake, markdown, html):
    browser.get(fake + "/")
    render = ("const box = document.createElement('div'); "
              "renderMarkdown(box, arguments[0], new Uint8Array(arguments[0].length)); return box.innerHTML")
    assert browser.execute_script(render, markdown) == html


def test_markup_in_an_answer_is_text(browser, fake):
    pd.open_page(browser, fake, "stand-in")
    answer = pd.find(pd.say(browser, "xss"), ".assistant")
    time.sleep(0.3)  # an injected handler would have run by now
    assert pd.js(browser, "window.pwned") is None
    assert pd.find_all(answer, "script, img, iframe, a") == []
    shown = pd.text_of(answer)
    for text in ('<script>window.pwned = 1</script>', '<img src=x onerror="window.pwned = 2">',
                 '<img src=x onerror="window.pwned = 3">', '<script>window.pwned = 5</script>'):
        assert text in shown


def test_an_open_fence_renders_as_code_while_streaming(browser, fake):
    pd.open_page(browser, fake, "stand-in")
    _Fake.release.clear()
    try:
        n = pd.type_message(browser, "gate")
        turn = pd.turns(browser)[n]
        # the fence is open: what came so far is code (with the newline that came last)
        pd.wait(browser, lambda d: pd.text_of(pd.find(turn, ".code pre code")) == "def f():\n", 30)
        code = pd.find(turn, ".code pre code")  # the stream waits: no more renders
        assert "```" not in pd.text_of(pd.find(turn, ".assistant"))
        assert [pd.text_of(s) for s in pd.find_all(code, "span.drafted")] == ["def f():\n"]
        assert turn.get_attribute("data-state") == "streaming"
        assert pd.find(browser, "#stop").is_displayed() and not pd.find(browser, "#send").is_displayed()
    finally:
        _Fake.release.set()
    pd.wait(browser, lambda d: pd.js(d, "busy === null"))
    assert pd.text_of(pd.find(turn, ".code pre code")) == "def f():\n    return 1"
    assert pd.text_of(pd.find_all(turn, ".assistant p")[-1]) == "Done."


def test_stop_keeps_what_came(browser, fake):
    pd.open_page(browser, fake, "stand-in")
    before = _Fake.disconnects
    n = pd.type_message(browser, "hold")
    turn = pd.turns(browser)[n]
    pd.wait(browser, lambda d: pd.text_of(pd.find(turn, ".code pre code")) == "def f():\n", 30)
    pd.find(browser, "#stop").click()
    pd.wait(browser, lambda d: pd.js(d, "busy === null"))
    assert turn.get_attribute("data-state") == "stopped"
    assert pd.notice(turn) == ("notice stopped", "Stopped: the answer is kept as far as it came.")
    kept = "".join(t for t, _ in HELD)
    assert pd.find(turn, ".assistant").get_attribute("data-markdown") == kept
    assert pd.history(browser) == ["user: hold", "assistant: " + kept]  # the screen and the history agree
    assert pd.find(browser, "#send").is_enabled() and not pd.find(browser, "#stop").is_displayed()
    pd.wait(browser, lambda d: _Fake.disconnects == before + 1, 30)  # the page let go of the stream


def test_notices_for_the_token_limit_and_errors(browser, fake):
    pd.open_page(browser, fake, "stand-in")
    turn = pd.say(browser, "long")
    assert turn.get_attribute("data-state") == "length"
    assert pd.notice(turn) == ("notice length", "Stopped at the token limit (9 tokens): raise max tokens, "
                                              "or ask it to go on.")
    assert "9 tokens" in pd.parts(turn)[3]
    assert pd.notice(pd.say(browser, "hello")) is None  # finish_reason "stop": no notice


@pytest.mark.parametrize("say, shown", [
    ("fail", "error: generation failed: boom"),  # an error event after some text
    ("cut", "error: the stream ended before the answer was complete"),
])
def test_an_error_after_some_text_keeps_it_with_a_notice(browser, fake, say, shown):
    pd.open_page(browser, fake, "stand-in")
    first = pd.parts(pd.say(browser, "hello"))[0]
    turn = pd.say(browser, say)
    assert turn.get_attribute("data-state") == "error" and pd.notice(turn) == ("notice error", shown)
    kept = pd.parts(turn)[0]
    assert kept and MARKDOWN.startswith(kept)
    assert pd.history(browser) == ["user: hello", "assistant: " + first, f"user: {say}", "assistant: " + kept]
    pd.say(browser, "on")
    assert [m["content"] for m in _Fake.bodies[-1]["messages"]] == ["hello", first, say, kept, "on"]


@pytest.mark.parametrize("say, shown", [
    ("refuse", "error: max_tokens 100000 is too many"),  # a 400 with a JSON error body
    ("fail early", "error: the model is gone"),  # an error event before any text
])
def test_a_turn_that_fails_before_any_text_is_taken_back(browser, fake, say, shown):
    pd.open_page(browser, fake, "stand-in")
    first = pd.parts(pd.say(browser, "hello"))[0]
    assert pd.say(browser, say) is None
    assert len(pd.turns(browser)) == 1 and pd.history(browser) == ["user: hello", "assistant: " + first]
    assert pd.text_of(pd.find(browser, "#error")) == shown and pd.find(browser, "#error").is_displayed()
    assert pd.find(browser, "#input").get_attribute("value") == say  # back in the input, to edit or resend
    pd.find(browser, "#input").clear()
    pd.say(browser, "on")
    assert [m["content"] for m in _Fake.bodies[-1]["messages"]] == ["hello", first, "on"]
    assert not pd.find(browser, "#error").is_displayed()


def test_the_figures_explain_themselves(browser, fake):
    pd.open_page(browser, fake, "stand-in")
    fig = pd.parts(pd.say(browser, "plain"))[2]
    assert "nothing drafted" in pd.text_of(fig) and "0/0" not in pd.text_of(fig)
    labels = [s for s in pd.find_all(fig, "span") if "sep" not in s.get_attribute("class")]
    assert len(labels) == 6 and all(s.get_attribute("title") for s in labels)
    pd.find(fig, "button.why").click()
    assert all(pd.text_of(dd).strip() for dd in pd.find_all(browser, ".legend dd"))
    assert [pd.text_of(dt) for dt in pd.find_all(browser, ".legend dt")][:6] == [
        "tokens", "tok/s", "drafted", "accepted", "acceptance", "prompt tokens cached"]
    pd.find(fig, "button.why").click()
    assert pd.find_all(browser, ".legend") == []


def test_highlighting_can_be_switched_off_and_is_remembered(browser, fake):
    pd.open_page(browser, fake, "stand-in")
    turn = pd.say(browser, "write f")
    span = pd.find_all(turn, "span.drafted")[0]
    background = "getComputedStyle(arguments[0]).backgroundColor"
    assert pd.js(browser, background, span) != "rgba(0, 0, 0, 0)"
    pd.find(browser, "#highlight").click()
    assert pd.js(browser, background, span) == "rgba(0, 0, 0, 0)"
    pd.open_page(browser, fake, "stand-in")  # a new page load keeps the choice
    assert not pd.find(browser, "#highlight").is_selected()
    span = pd.find_all(pd.say(browser, "write f"), "span.drafted")[0]  # still marked in the DOM, just not shown
    assert pd.js(browser, background, span) == "rgba(0, 0, 0, 0)"
    pd.find(browser, "#highlight").click()
    assert pd.js(browser, background, span) != "rgba(0, 0, 0, 0)"
    assert pd.js(browser, "localStorage.getItem('ngramcache.highlight')") == "on"


def test_the_empty_page_says_what_to_do(browser, fake):
    pd.open_page(browser, fake, "stand-in")
    empty = pd.find(browser, "#empty")
    assert empty.is_displayed()
    assert "stand-in" in empty.text and "highlighted" in empty.text and "Enter sends" in empty.text
    example = pd.find_all(empty, ".examples button")[0]
    said = example.text
    example.click()  # an example is sent as it is
    pd.wait(browser, lambda d: pd.js(d, "busy === null"))
    assert _Fake.bodies[-1]["messages"] == [{"role": "user", "content": said}]
    assert not empty.is_displayed()
    pd.find(browser, "#new").click()
    assert empty.is_displayed()


def test_favicon_and_a_clean_console(browser, fake):
    browser.get_log("browser")  # forget what earlier tests left
    pd.open_page(browser, fake, "stand-in")
    assert pd.js(browser, "document.querySelector('link[rel=icon]').href").startswith("data:image/svg+xml;base64,")
    pd.say(browser, "write f")
    n = pd.type_message(browser, "hold")
    pd.wait(browser, lambda d: pd.find(pd.turns(d)[n], ".code"), 30)
    pd.find(browser, "#stop").click()  # an aborted stream is no error either
    pd.wait(browser, lambda d: pd.js(d, "busy === null"))
    time.sleep(1)  # the favicon is asked for after the page has loaded
    assert pd.console_errors(browser) == []


@pytest.mark.parametrize("name, width, height, mobile", [("desktop", 1280, 800, False), ("phone", 390, 844, True)])
def test_layout_holds(browser, fake, tmp_path, name, width, height, mobile):
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": width, "height": height, "deviceScaleFactor": 2 if mobile else 1,
                             "mobile": mobile})
    try:
        pd.open_page(browser, fake, "stand-in")
        browser.save_screenshot(str(tmp_path / f"{name}-empty.png"))
        pd.say(browser, "write f")
        turn = pd.say(browser, "tall")
        browser.save_screenshot(str(tmp_path / f"{name}-answer.png"))
        assert pd.js(browser, "[innerWidth, innerHeight]") == [width, height]
        assert pd.js(browser, "document.documentElement.scrollWidth <= innerWidth")
        assert pd.js(browser, "document.getElementById('log').scrollWidth <= document.getElementById('log').clientWidth")
        log = pd.js(browser, "document.getElementById('log').getBoundingClientRect().toJSON()")
        assert log["bottom"] <= height
        for elem, inside in ((pd.find(browser, "#input"), None), (pd.find(browser, "#send"), None),
                             (pd.find(turn, ".figures"), log)):
            box = pd.js(browser, "arguments[0].getBoundingClientRect().toJSON()", elem)
            assert box["height"] > 0 and 0 <= box["top"] and box["bottom"] <= height, (elem, box)
            if inside:  # the newest figures are in view, not under the input
                assert inside["top"] <= box["top"] and box["bottom"] <= inside["bottom"], (box, inside)
        # the answer is long: it scrolled, and the code and table scroll inside themselves
        assert pd.js(browser, "document.getElementById('log').scrollTop") > 0
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


# --- the API key, and rendering that does not grow with the answer ---------------------------


def test_the_page_asks_for_the_key_once(browser, fake):
    from selenium.webdriver.support import expected_conditions as ec

    _Fake.key = "sesame"
    _Fake.keys_seen = []
    try:
        browser.get(fake + "/")
        alert = pd.wait(browser, ec.alert_is_present(), 30)
        assert "API key" in alert.text
        alert.send_keys("sesame")
        alert.accept()
        pd.wait(browser, lambda d: pd.text_of(pd.find(d, "#model")) == "stand-in", 30)
        for text in ("first", "second"):  # no more questions: the key is kept for the tab
            turn = pd.say(browser, text)
            assert turn is not None and turn.get_attribute("data-state") == "done"
        assert _Fake.keys_seen[0] is None and set(_Fake.keys_seen[1:]) == {"Bearer sesame"}
        assert len(_Fake.keys_seen) == 4  # models refused, models, two chats
    finally:
        _Fake.key = None
        browser.execute_script("sessionStorage.clear()")


def _render_ms(driver, text: str) -> float:
    """The page's own renderer on ``text``: the best of three, in milliseconds."""
    return pd.js(driver, """(() => {
      const text = arguments[0], marks = new Uint8Array(text.length), box = document.createElement("div");
      let best = Infinity;
      for (let k = 0; k < 3; k++) {
        const t0 = performance.now();
        renderMarkdown(box, text, marks);
        best = Math.min(best, performance.now() - t0);
      }
      return best;
    })()""", text)


@pytest.mark.parametrize("unit", ["*a ", "_a ", "[a](", "``a `", "[", "**a *b "])
def test_markdown_renders_in_linear_time(browser, fake, unit):
    # eight times the text: about eight times the work, not sixty-four (each opener used to
    # look for its closer to the end of the text: "*a " x 4000 took a quarter of a second)
    pd.open_page(browser, fake, "stand-in")
    small, large = (_render_ms(browser, unit * n) for n in (4000, 32000))
    assert large < 20 * max(small, 1.0), (unit, small, large)


def test_a_streaming_answer_renders_only_what_changed(browser, fake):
    pd.open_page(browser, fake, "stand-in")
    same, kept, count, whole, incremental = pd.js(browser, r"""(() => {
      const box = document.createElement("div"), a = new Answer(box);
      a.add("First paragraph with **bold**.\n\n", false);
      a.add("- an item\n- another\n\n```\ncode\n\nmore code\n", true);
      a.add("```\n\nThird", false);
      a.render();
      const first = box.firstChild;
      first.seen = "yes";  // a property, not an attribute: the markup is compared below
      for (let k = 0; k < 50; k++) a.add(" words, and more words\n\nPara " + k, k % 2 === 0);
      a.render();
      const same = box.firstChild === first && box.childNodes[1].tagName === "UL";
      const kept = box.firstChild.seen, incremental = box.innerHTML;
      a.render(true);
      return [same, kept, box.childNodes.length, box.innerHTML, incremental];
    })()""")
    assert same and kept == "yes" and count == 54
    assert incremental == whole  # what was kept is what a whole render gives
