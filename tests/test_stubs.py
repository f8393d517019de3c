"""The type stub of the compiled core (src/ngramcache/_core.pyi) is generated from the module by
scripts/gen_stubs.py; these tests fail when the committed stub and the built module differ."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from ngramcache import _core

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gen_stubs.py"


@pytest.fixture(scope="module")
def gen_stubs():
    spec = importlib.util.spec_from_file_location("gen_stubs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_stub_is_the_modules():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_stub_declares_every_public_name_of_the_module(gen_stubs):
    tree = ast.parse(gen_stubs.render(_core))
    declared = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    public = {name for name in vars(_core) if not name.startswith("__")}
    assert public <= declared, sorted(public - declared)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def methods(name: str) -> set[str]:
        """The class's own methods and those of the bases the stub names."""
        node = classes[name]
        own = {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
        return own.union(*(methods(b.id) for b in node.bases))

    # the protocol's methods are declared once, on the base every compiled drafter derives from
    assert [b.id for b in classes["LookupDrafter"].bases] == ["CompiledDrafter"]
    assert {"reset", "accept", "step", "__init__"} <= methods("LookupDrafter")
    assert [b.id for b in classes["NgramMod"].bases] == ["LlamaShapedDrafter"]
    assert {"sync", "extend", "begin", "draft", "accept", "__init__", "table"} <= methods("NgramMod")


def test_signatures_are_translated_and_none_stays_visible(gen_stubs):
    name, params, ret = gen_stubs.parse_signature(
        "draft(tokens: typing.Annotated[numpy.typing.ArrayLike, numpy.int32], n: typing.SupportsInt | "
        "typing.SupportsIndex = 8, dynamic: ngramcache._core.NgramCache | None = None) -> "
        "numpy.typing.NDArray[numpy.int32]", method=False)
    assert name == "draft"
    assert params == "tokens: Tokens, n: int = 8, dynamic: NgramCache | None = None"
    assert ret == "numpy.typing.NDArray[numpy.int32]"
    assert gen_stubs.parse_signature("get(self: _core.X, a: dict[str, int]) -> int", method=True)[1] == \
        "self, a: dict[str, int]"


def test_a_cpp_type_in_a_signature_is_refused(gen_stubs):
    with pytest.raises(gen_stubs.StubError, match="C\\+\\+ type"):
        gen_stubs.parse_signature("f(x: ngramcache::SharedCache) -> None", method=False)
    with pytest.raises(gen_stubs.StubError, match="C\\+\\+ type"):
        gen_stubs.parse_signature("f() -> std::vector<int>", method=False)
