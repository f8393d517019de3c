"""Fixtures of the paired benchmarks (bench/test_bench_*.py): the token stream they share,
and the report of each group's ratio baseline / ngramcache at the end of a run.

    .venv/bin/python -m pytest bench/ --benchmark-only        # time them (docs/benchmarks.md)
    .venv/bin/python -m pytest bench/ --benchmark-disable     # run each once, results checked
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
# bench/ for pairs.py and stdlib_stream.py, tests/ for the pure-Python reference models
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import pairs  # noqa: E402
import stdlib_stream  # noqa: E402

# The stream: its first STATIC_CORPUS tokens are the corpus a static cache is counted
# from; the rest is the document being drafted (a different part of the library, so the
# static cache knows its language but not its text).
STREAM_TOKENS = 200_000
STATIC_CORPUS = 150_000


@pytest.fixture(scope="session")
def stream() -> np.ndarray:
    try:
        return stdlib_stream.stdlib_tokens(STREAM_TOKENS)
    except stdlib_stream.StreamTooShort as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def static_corpus(stream) -> np.ndarray:
    return stream[:STATIC_CORPUS]


@pytest.fixture(scope="session")
def document(stream) -> np.ndarray:
    return stream[STATIC_CORPUS:]


@pytest.fixture(scope="session")
def baseline_results() -> pairs.BaselineResults:
    return pairs.BaselineResults()


@pytest.fixture(autouse=True)
def _record_pair(request):
    # torn down after the benchmark fixture (autouse fixtures are set up first), so the
    # benchmark's statistics are complete here
    yield
    bench = request.node.funcargs.get("benchmark")
    if bench is not None:
        pairs.record(bench)


@pytest.hookimpl(hookwrapper=True)
def pytest_terminal_summary(terminalreporter):
    # a wrapper, so that the ratios come after pytest-benchmark's tables and are printed
    # even when its --benchmark-compare-fail check raises there
    yield
    lines = pairs.ratio_lines()
    if lines:  # none when benchmarks were disabled or skipped
        terminalreporter.write_sep("-", "baseline / ngramcache (medians, this run)")
        for line in lines:
            terminalreporter.write_line(line)
