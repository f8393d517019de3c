"""ngramcache.progress: the progress bar (log lines, a redrawn terminal line, quiet) and the
formatting of counts, sizes, durations and peak memory."""

from __future__ import annotations

import io
import re

import pytest

from ngramcache.progress import Progress, fmt_bytes, fmt_count, fmt_seconds, peak_rss_bytes


class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_log_mode_is_quiet_for_short_tasks():
    s = io.StringIO()
    with Progress(100, "tokenizing", stream=s) as bar:
        bar.update(50)
        bar.update(50)
    assert s.getvalue() == ""


def test_progress_log_lines(monkeypatch):
    s = io.StringIO()
    monkeypatch.setattr(Progress, "LOG_INTERVAL", 0.0)
    with Progress(2_000_000, "counting", unit="tok", stream=s) as bar:
        bar.update(1_000_000)
    lines = s.getvalue().splitlines()
    assert "\r" not in s.getvalue()
    assert lines[0].startswith("counting:  50% [") and "ETA" in lines[0] and "1M tok / 2M tok" in lines[0]
    assert len(lines) == 2 and "done" not in lines[0]


def test_progress_tty_redraws_in_place(monkeypatch):
    s = _TTY()
    monkeypatch.setattr(Progress, "TTY_INTERVAL", 0.0)
    monkeypatch.delenv("TERM", raising=False)
    with Progress(10, "writing", unit="B", stream=s) as bar:
        for _ in range(10):
            bar.update(1)
    out = s.getvalue()
    assert out.count("\r") == 11 and out.endswith("\n") and "100%" in out and "done" in out


def test_progress_quiet_and_unknown_total(monkeypatch):
    s = _TTY()
    monkeypatch.setattr(Progress, "TTY_INTERVAL", 0.0)
    with Progress(10, "x", quiet=True, stream=s) as bar:
        bar.update(5)
    assert s.getvalue() == ""
    with Progress(None, "scan", unit="files", stream=s) as bar:
        bar.update(3)
    assert "scan: 3 files" in s.getvalue() and "ETA" not in s.getvalue()
    with pytest.raises(ValueError):
        Progress(-1, "x")


def test_formatting_and_rss():
    assert fmt_count(1234) == "1234" and fmt_count(1_234_567) == "1.23M" and fmt_count(250_000) == "250k"
    assert fmt_bytes(512) == "512 B" and fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(3 * 2**30) == "3.0 GiB"
    assert fmt_seconds(0.5) == "0.50 s" and fmt_seconds(75) == "1:15" and fmt_seconds(3725) == "1:02:05"
    rss = peak_rss_bytes()
    assert 10 * 2**20 < rss < 64 * 2**30
    assert peak_rss_bytes(include_children=True) >= rss
    assert re.fullmatch(r"\d+", str(rss))
