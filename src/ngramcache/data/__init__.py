"""Demo and benchmark prompts.

The demo's prompt and the exactness check's prompt are shipped with the package (text files
here), so that they are the same on every machine. The benchmark prompts are built at run
time from real text already on the machine, nothing fetched: code from the Python standard
library's own source files, prose from the licence texts Debian installs under
/usr/share/common-licenses (with the stdlib's own documentation as a fallback).
"""

from __future__ import annotations

import ast
import os
import sysconfig
from dataclasses import dataclass
from importlib import resources


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str
    source: str  # where the text came from


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def stdlib_function(relpath: str, name: str) -> str:
    """The source text of top-level function ``name`` in stdlib file ``relpath``
    (read from the file, so frozen modules work too)."""
    path = os.path.join(stdlib_dir(), relpath)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise FileNotFoundError(f"the Python standard library source {path} is not available ({e})") from e
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            start = node.lineno - 1 - len(node.decorator_list)
            return "".join(lines[start : node.end_lineno])
    raise LookupError(f"no top-level function {name!r} in {path}")


def _read_first(paths: list[str], limit: int) -> tuple[str, str]:
    for p in paths:
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                return f.read(limit), p
        except OSError:
            continue
    raise FileNotFoundError("none of these texts is available: " + ", ".join(paths))


def _cut(text: str, limit: int) -> str:
    """At most ``limit`` characters, cut at a paragraph (or line) boundary."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n\n", 0, limit)
    if cut < limit // 2:
        cut = text.rfind("\n", 0, limit)
    return text[: cut if cut > 0 else limit]


def prose(limit: int = 3000) -> tuple[str, str]:
    """(text, source): a long real document, cut at a paragraph boundary."""
    cands = ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
             os.path.join(stdlib_dir(), "..", "..", "share", "doc")]
    try:
        text, src = _read_first(cands[:2], limit * 4)
    except FileNotFoundError:
        # the stdlib's longest docstring-rich prose: the licence CPython ships
        text, src = _read_first([os.path.join(stdlib_dir(), "LICENSE.txt")], limit * 4)
    return _cut(text.strip(), limit), src


def shipped(name: str) -> str:
    """The text of file ``name`` shipped in this package's data folder."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def _type_hints_prompt(code: str) -> str:
    return ("Add type hints to this Python function. Keep everything else exactly as it is.\n\n"
            f"```python\n{code}```\n\nThe same function with type hints:\n\n```python\n")


def demo_task() -> Task:
    """The demo's default: add type hints to a 45-line function shipped with the package
    (the answer mostly copies the function, which is what lookup drafting is for)."""
    return Task("edit code", _type_hints_prompt(shipped("demo_function.py.txt")),
                "a type-hints task (shipped with ngramcache)")


def type_hints_task(relpath: str = "posixpath.py", name: str = "relpath") -> Task:
    """Add type hints to a real stdlib function (read from this machine's stdlib)."""
    return Task("edit code", _type_hints_prompt(stdlib_function(relpath, name)), f"stdlib {relpath}:{name}")


def summary_task(limit: int = 2400) -> Task:
    text, src = prose(limit)
    prompt = f"{text}\n\nSummarise the text above, quoting its key sentences.\n\nSummary:\n"
    return Task("summarise", prompt, src)


def rag_task(limit: int = 2400) -> Task:
    text, src = prose(limit)
    prompt = (f"Document:\n{text}\n\nQuestion: What does the document say about the freedom to "
              "change the software? Answer by quoting the relevant passage word for word.\n\nAnswer:")
    return Task("RAG quote", prompt, src)


def conversation_task() -> Task:
    code = stdlib_function("textwrap.py", "dedent")
    code2 = stdlib_function("shlex.py", "quote")
    prompt = (
        "User: Here is a function.\n\n```python\n" + code2 + "```\n\nRename the variable s to text.\n\n"
        "Assistant: Here it is with the variable renamed.\n\n```python\n"
        + code2.replace("(s)", "(text)").replace(" s ", " text ").replace("not s", "not text")
        + "```\n\nUser: Thanks. Now this one:\n\n```python\n" + code + "```\n\n"
        "Remove the comments and keep the code the same.\n\nAssistant: Here is the function without comments.\n\n"
        "```python\n")
    return Task("conversation", prompt, "stdlib shlex.py:quote, textwrap.py:dedent")


def open_task() -> Task:
    prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\nStory:\n"
    return Task("open-ended", prompt, "control prompt (no text to copy)")


def bench_tasks() -> list[Task]:
    return [summary_task(), type_hints_task(), rag_task(), conversation_task(), open_task()]
