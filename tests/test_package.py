"""The package surface: version, exports, type information; the release artefacts and the wheel
installed from them (scripts/build-release)."""

import email.parser
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
import sysconfig
import tarfile
import zipfile
from importlib.resources import files
from pathlib import Path

import pytest

import ngramcache as nc

ROOT = Path(__file__).resolve().parent.parent


def _pyproject_version() -> str:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def test_version_comes_from_pyproject():
    assert nc.__version__ == _pyproject_version()


def test_every_export_exists():
    missing = [name for name in nc.__all__ if not hasattr(nc, name)]
    assert not missing


@pytest.mark.parametrize("short, module", [("ngramcache.llama", "ngramcache.integrations.llama"),
                                           ("ngramcache.hf", "ngramcache.integrations.hf")])
def test_short_entry_points_hold_their_modules_public_names(short, module):
    """``ngramcache.llama`` and ``ngramcache.hf`` are modules of their own (not another module
    under a second name) that import exactly the public names of the module defining them."""
    import importlib

    try:
        entry, real = importlib.import_module(short), importlib.import_module(module)
    except ImportError as e:  # an extra that is not installed
        pytest.skip(f"{module} cannot be imported here: {e}")
    assert entry is not real and entry.__name__ == short
    assert entry.__all__ == real.__all__
    assert [n for n in entry.__all__ if getattr(entry, n) is not getattr(real, n)] == []
    assert {n for n in vars(entry) if not n.startswith("_")} == set(entry.__all__)


def test_no_module_puts_itself_under_another_name():
    """One name per module: none replaces itself in sys.modules (as a second name for another)."""
    src = ROOT / "src" / "ngramcache"
    swaps = [str(p.relative_to(src)) for p in src.rglob("*.py")
             if re.search(r"sys\.modules\[__name__\]\s*=", p.read_text(encoding="utf-8"))]
    assert swaps == []
    assert not [name for name in ("generation", "server", "sharded", "speculative", "text", "tokenizers")
                if (src / f"{name}.py").exists()]
    assert not hasattr(nc, "speculative")


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


# --- the release artefacts and the installed wheel (scripts/build-release) --------------

def test_installed_wheel_under_test():
    # scripts/build-release --test and cibuildwheel run these tests from a copy of tests/ against
    # the wheel installed in a fresh environment: make sure that is what they import
    if not os.environ.get("NGRAMCACHE_EXPECT_INSTALLED"):
        pytest.skip("only against an installed wheel (scripts/build-release --test, cibuildwheel)")
    assert not (ROOT / "src" / "ngramcache").exists(), "the tests run beside a source tree"
    assert sys.prefix != sys.base_prefix, "not in a virtual environment"
    site = Path(sysconfig.get_paths()["platlib"]).resolve()
    for module in (nc, nc._core):
        assert Path(module.__file__).resolve().is_relative_to(site), module.__file__
    dist = importlib.metadata.distribution("ngramcache")
    assert dist.version == nc.__version__
    direct_url = dist.read_text("direct_url.json")
    if direct_url is not None:  # pip records where it installed from: a wheel, not a folder
        assert "dir_info" not in json.loads(direct_url), direct_url
    # the core needs none of the model runtimes
    for runtime in ("llama_cpp", "torch", "transformers", "fastapi"):
        assert importlib.util.find_spec(runtime) is None, runtime


@pytest.fixture(scope="module")
def release() -> dict[str, Path]:
    """The artefacts scripts/build-release left in $NGRAMCACHE_RELEASE_DIR: one sdist, one wheel."""
    where = os.environ.get("NGRAMCACHE_RELEASE_DIR")
    if not where:
        pytest.skip("set NGRAMCACHE_RELEASE_DIR to scripts/build-release's output to check it")
    (sdist,) = Path(where).glob("*.tar.gz")
    (wheel,) = Path(where).glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def _wheel_members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {name: z.read(name) for name in z.namelist() if not name.endswith("/")}


def _sdist_members(sdist: Path) -> dict[str, bytes]:
    """The sdist's members by path inside its top folder (name-version/)."""
    with tarfile.open(sdist) as t:
        members = [m for m in t.getmembers() if m.isfile()]
        top = {m.name.split("/", 1)[0] for m in members}
        assert len(top) == 1, top
        return {m.name.split("/", 1)[1]: t.extractfile(m).read() for m in members}


def _header(metadata: bytes, field: str) -> list[str]:
    return email.parser.BytesHeaderParser().parsebytes(metadata).get_all(field) or []


def test_release_artefacts_carry_pyprojects_version(release):
    version = _pyproject_version()
    members = _wheel_members(release["wheel"])
    assert release["wheel"].name.startswith(f"ngramcache-{version}-")
    assert release["sdist"].name == f"ngramcache-{version}.tar.gz"
    metadata = members[f"ngramcache-{version}.dist-info/METADATA"]
    assert _header(metadata, "Name") == ["ngramcache"]
    assert _header(metadata, "Version") == [version]
    assert _header(_sdist_members(release["sdist"])["PKG-INFO"], "Version") == [version]


def test_release_wheel_is_manylinux_and_holds_the_package(release):
    members = _wheel_members(release["wheel"])
    (info,) = {name.split("/")[0] for name in members if name.split("/")[0].endswith(".dist-info")}
    tags = _header(members[f"{info}/WHEEL"], "Tag")
    assert tags and all("-manylinux_" in tag for tag in tags), tags
    assert any(re.fullmatch(r"ngramcache/_core\.cpython-[^/]+\.so", name) for name in members), sorted(members)
    for name in ("py.typed", "_core.pyi", "__init__.py", "cli/main.py", "data/chat.html"):
        assert f"ngramcache/{name}" in members, name
    assert b"ngramcache = ngramcache.cli.main:main" in members[f"{info}/entry_points.txt"]
    strays = [name for name in members if name.split("/")[0] not in ("ngramcache", info)]
    assert not strays
    assert not [name for name in members if "__pycache__" in name or name.endswith(".pyc")]


def test_release_sdist_holds_what_a_build_needs_and_no_bulk(release):
    members = _sdist_members(release["sdist"])
    for name in ("pyproject.toml", "CMakeLists.txt", "README.md", "cpp/bind/module.cpp", "src/ngramcache/__init__.py",
                 "src/ngramcache/_core.pyi", "src/ngramcache/py.typed", "src/ngramcache/data/chat.html"):
        assert name in members, name
    # every header the binding and the exact products include, and those they include, down to the last one
    wanted, seen = [name for name in members if name.startswith(("cpp/bind/", "cpp/ggml/")) and name.endswith(".cpp")], set()
    assert "cpp/ggml/exact_matmul.cpp" in wanted
    assert len(wanted) > 1, wanted
    while wanted:
        source = wanted.pop()
        seen.add(source)
        for included in re.findall(rb'^\s*#\s*include\s+"([^"]+)"', members[source], re.M):
            here = Path(source).parent / included.decode()
            options = [str(here), f"cpp/include/{included.decode()}"]
            found = [p for p in options if p in members]
            assert found, f"{source} includes {included.decode()}, which the sdist lacks"
            wanted += [p for p in found[:1] if p not in seen]
    assert len(seen) > 2, seen  # the binding and at least some of the core
    top_level_bulk = ("tests/", "bench/", "fuzz/", "build/", "scripts/", ".venv", ".ci/", "cpp/tests/", "cpp/bench/", "dist/")
    assert not [name for name in members if name.startswith(top_level_bulk)]
    assert not [name for name in members if "__pycache__" in name or name.endswith((".so", ".pyc", ".pyd"))]
