"""The ```python blocks of README.md and docs/*.md run as written: each file's blocks in order,
in one interpreter and one namespace, as one reader's session, from an empty folder (so a
block may read only what an earlier block wrote). Sessions that load a model are marked
``model``; without one, the blocks before the first such block still run.

docs/api.md is left out: its blocks are signatures generated from the code (checked by
tests/test_package.py). A block preceded by ``<!-- not run by the tests: REASON -->`` is left
out too, for the reason given (it talks to a server on the network, say); the README has none.
Nothing here reaches the network: the blocks run with Hugging Face's offline switches set."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GENERATED = {"api.md"}
# a block is fenced as ```python ... ```; a marker on the line(s) before it leaves it out
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
NOT_RUN = re.compile(r"<!-- not run by the tests: (.+?) -->\s*\Z", re.S)
# what loads a model (llama-cpp-python's or transformers'): the session then needs one
LOADS_MODEL = re.compile(r"\bmake_llama\(|\bLlama\(|\bload_model\(|\bEngine\(")
SESSION_TIMEOUT_S = 900


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the block's first line of code
    code: str
    not_run: str | None  # the reason it is left out, or None

    @property
    def loads_model(self) -> bool:
        return bool(LOADS_MODEL.search(self.code))

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()]
        marker = NOT_RUN.search(before[-400:])
        out.append(Block(path, before.count("\n") + 2, m.group(1), marker.group(1).strip() if marker else None))
    return out


def doc_files() -> list[Path]:
    return [README] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in GENERATED)


def _sessions():
    """(file, blocks to run, needs a model) for each file with blocks to run: the blocks
    before the first that loads a model, then (marked model) all of them."""
    if not README.is_file():  # the tests run from a copy without the docs (an installed wheel's)
        return []
    out = []
    for path in doc_files():
        run = [b for b in blocks(path) if b.not_run is None]
        first_model = next((i for i, b in enumerate(run) if b.loads_model), len(run))
        name = str(path.relative_to(ROOT))
        if first_model:
            out.append(pytest.param(run[:first_model], id=f"{name} without a model"))
        if first_model < len(run):
            out.append(pytest.param(run, id=f"{name} with a model", marks=pytest.mark.model))
    return out


# Runs in a fresh interpreter: each block compiled under its file and line (a traceback names
# them), executed in one namespace, with a line on stderr before each block.
DRIVER = textwrap.dedent("""
    import json, sys
    namespace = {"__name__": "__main__"}
    for where, code in json.load(sys.stdin):
        print(f"--- {where}", file=sys.stderr, flush=True)
        exec(compile(code, where, "exec"), namespace)
""")


def _needs(run: list[Block]) -> None:
    """Skip, saying what is missing, where a session needs a model this machine lacks."""
    code = "\n".join(b.code for b in run)
    if re.search(r"\bmake_llama\(|\bLlama\(|\bEngine\(", code):
        pytest.importorskip("llama_cpp")
    if "hf." in code or "load_model(" in code:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    if any(b.loads_model for b in run):
        from ngramcache.models import default_model_path
        try:
            default_model_path("smollm2")
        except FileNotFoundError as e:
            pytest.skip(str(e))


@pytest.mark.parametrize("run", _sessions())
def test_the_blocks_run_as_one_session(run, tmp_path):
    import json

    _needs(run)
    env = dict(os.environ, MPLBACKEND="Agg", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", DRIVER], cwd=tmp_path, env=env, capture_output=True, text=True,
                          input=json.dumps([(b.where, b.code) for b in run]), timeout=SESSION_TIMEOUT_S)
    assert done.returncode == 0, f"a block failed:\n{done.stderr[-6000:]}"
    assert done.stderr.count("--- ") >= len(run)  # every block ran


def test_every_block_of_the_readme_runs_and_none_builds_a_bare_llama():
    if not README.is_file():
        pytest.skip("README.md is not in this copy of the tests")
    found = blocks(README)
    assert len(found) >= 2
    assert [b.where for b in found if b.not_run] == []
    # llama_cpp.Llama built by hand is not exact (docs/exactness.md); make_llama is
    assert [b.where for b in found if re.search(r"(?<![\w.])Llama\(", b.code)] == []


def test_every_block_compiles_and_every_left_out_block_says_why():
    if not README.is_file():
        pytest.skip("README.md is not in this copy of the tests")
    found = [b for path in doc_files() for b in blocks(path)]
    assert len(found) >= 10
    for b in found:
        compile(b.code, b.where, "exec")  # a SyntaxError names the file and line
    assert all(len(b.not_run) > 10 for b in found if b.not_run)


def test_the_block_finder_reads_markers_and_lines(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# t\n\n```python\nx = 1\n```\n\n<!-- not run by the tests: it needs a server -->\n"
                   "```python\nimport openai\n```\n\n```bash\nls\n```\n\n```python\ny = make_llama()\n```\n")
    found = [(b.line, b.code, b.not_run, b.loads_model) for b in blocks(doc)]
    assert found == [(4, "x = 1\n", None, False), (9, "import openai\n", "it needs a server", False),
                     (17, "y = make_llama()\n", None, True)]
