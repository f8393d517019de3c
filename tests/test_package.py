"""The package surface: version, exports, type information."""

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
