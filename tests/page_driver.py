"""Driving the chat page in a real headless Chromium (selenium): the ``browser`` fixture
and the helpers that tests/test_serve_page.py and tests/test_serve_page_model.py share.
Needs Debian's ``chromium`` and ``chromium-driver``; the fixture skips without them."""

from __future__ import annotations

import json
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 180  # the longest a turn may take on a slow, shared machine



@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,800"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for its errors
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver, cond, timeout=WAIT_S):
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # a streaming answer is rendered afresh as it grows: elements found in it may go stale
    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=ignored).until(cond)


def js(driver, script, *args):
    return driver.execute_script("return " + script, *args)


def text_of(elem) -> str:
    # textContent, not .text: .text is the rendered text, with whitespace changed
    return elem.get_attribute("textContent")


def find(elem, css):
    from selenium.webdriver.common.by import By

    return elem.find_element(By.CSS_SELECTOR, css)


def find_all(elem, css):
    from selenium.webdriver.common.by import By

    return elem.find_elements(By.CSS_SELECTOR, css)


def turns(driver):
    return find_all(driver, "#log .turn")


def open_page(driver, base: str, model: str):
    driver.get(base + "/")
    wait(driver, lambda d: text_of(find(d, "#model")) == model, 30)


def type_message(driver, text: str, max_tokens: int | str | None = None, drafter: str | None = None):
    """Type ``text`` and send it; returns the number of turns before it."""
    from selenium.webdriver.support.ui import Select

    if max_tokens is not None:
        box = find(driver, "#max-tokens")
        box.clear()
        box.send_keys(str(max_tokens))
    if drafter is not None:
        Select(find(driver, "#drafter")).select_by_value(drafter)
    n = len(turns(driver))
    find(driver, "#input").send_keys(text)
    find(driver, "#send").click()
    return n


def say(driver, text: str, max_tokens: int | str | None = None, drafter: str | None = None):
    """Send ``text`` and return its turn once the answer has ended (None if the page took
    the turn back)."""
    n = type_message(driver, text, max_tokens, drafter)
    wait(driver, lambda d: js(d, "busy === null"))
    now = turns(driver)
    return now[n] if len(now) > n else None


def parts(turn):
    """(the answer's Markdown, [drafted span texts], figures element, figures text, the request sent)."""
    answer = find(turn, ".assistant")
    spans = [text_of(s) for s in find_all(answer, "span.drafted")]
    fig = find(turn, ".figures")
    return (answer.get_attribute("data-markdown"), spans, fig, text_of(fig),
            json.loads(turn.get_attribute("data-request")))


def notice(turn) -> tuple[str, str] | None:
    found = find_all(turn, ".notice")
    return (found[0].get_attribute("class"), text_of(found[0])) if found else None


def history(driver) -> list[str]:
    return js(driver, "messages.map(m => m.role + ': ' + m.content)")


def other_origins(driver, base: str) -> list[str]:
    """The resources the page loaded from anywhere but ``base``."""
    names = js(driver, "performance.getEntriesByType('resource').map(e => e.name)")
    return [n for n in names if not n.startswith(base + "/")]


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
