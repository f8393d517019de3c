"""The package surface: version, exports, type information."""

import os
from importlib.resources import files
from pathlib import Path

import pytest

import ngramcache as nc

ROOT = Path(__file__).resolve().parent.parent


def test_version_comes_from_pyproject():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(ROOT / "pyproject.toml", "rb") as f:
        assert nc.__version__ == tomllib.load(f)["project"]["version"]


def test_every_export_exists():
    missing = [name for name in nc.__all__ if not hasattr(nc, name)]
    assert not missing


def test_type_information_is_installed():
    pkg = files("ngramcache")
    assert pkg.joinpath("py.typed").is_file()
    assert pkg.joinpath("_core.pyi").is_file()


def test_api_page_is_current():
    """docs/api.md is generated from the docstrings; a change to the API must regenerate it
    (python scripts/api_docs.py)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "scripts" / "api_docs.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_sanitized_build_under_test():
    # scripts/test's sanitised run puts a build with AddressSanitizer and UBSan first on the
    # path: make sure it is the one imported
    if not os.environ.get("NGRAMCACHE_EXPECT_SANITIZED"):
        pytest.skip("only in the sanitised run of scripts/test")
    core = Path(nc._core.__file__).read_bytes()
    assert b"__asan_report_load" in core and b"__ubsan_handle_" in core, nc._core.__file__
