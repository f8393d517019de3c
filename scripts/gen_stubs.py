#!/usr/bin/env python3
"""Writes src/ngramcache/_core.pyi from the compiled module itself, or checks it.

    python scripts/gen_stubs.py           # rewrite src/ngramcache/_core.pyi
    python scripts/gen_stubs.py --check   # exit 1 (with a diff) if the file differs

Every class, method, property and function of ``ngramcache._core`` is read from the module
in the order the binding registers them; each signature comes from the line pybind11 writes
at the head of its docstring (``name(self: _core.X, a: int = 1) -> None``), and the rest of
the docstring becomes the stub's. The types are pybind11's, with three abbreviations:
``Tokens`` for an int32 array argument, ``int`` for ``SupportsInt | SupportsIndex`` and
``float`` for ``SupportsFloat | SupportsIndex``. A C++ type name in a signature (a type the
binding never registered) is an error, so a stub never holds one. The test suite runs
``--check``, so the stub cannot drift from the binding.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
import types
from pathlib import Path

STUB = Path(__file__).resolve().parent.parent / "src" / "ngramcache" / "_core.pyi"

HEADER = '''\
# Generated from the compiled module by scripts/gen_stubs.py: do not edit by hand (the tests
# check that this file and the module agree). Arguments reach the core validated by the
# package (token arrays as C-contiguous int32).
import collections.abc
import typing

import numpy
import numpy.typing

Tokens = typing.Annotated[numpy.typing.ArrayLike, numpy.int32]
'''

ABBREVIATIONS = [
    ("typing.Annotated[numpy.typing.ArrayLike, numpy.int32]", "Tokens"),
    ("typing.SupportsInt | typing.SupportsIndex", "int"),
    ("typing.SupportsFloat | typing.SupportsIndex", "float"),
]
# The module's own classes, named as the stub defines them (pybind11 qualifies them with the
# name the module was imported under).
OWN = re.compile(r"\b(?:ngramcache\.)?_core\.")

# Dunder methods a class's stub lists (the others are Python's or pybind11's own).
DUNDERS = {"__init__", "__len__", "__contains__", "__iter__", "__getitem__"}

SIGNATURE = re.compile(r"^(?:\d+\. )?(?P<name>\w*)\((?P<params>.*)\) -> (?P<ret>.+)$")


class StubError(Exception):
    """The module has something a stub cannot say faithfully."""


def translate(annotation: str) -> str:
    """A pybind11 annotation as the stub writes it; refuses C++ type names."""
    for long, short in ABBREVIATIONS:
        annotation = annotation.replace(long, short)
    annotation = OWN.sub("", annotation)
    if "::" in annotation or "<" in annotation:
        raise StubError(f"a C++ type in a signature (is it registered?): {annotation}")
    return annotation


def split_top_level(text: str) -> list[str]:
    """Splits at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text.strip():
        parts.append(text[start:].strip())
    return parts


def parse_signature(line: str, method: bool) -> tuple[str, str, str]:
    """(name, parameters, return type) of one pybind11 signature line."""
    m = SIGNATURE.match(line.strip())
    if m is None:
        raise StubError(f"not a pybind11 signature: {line!r}")
    params = []
    for i, p in enumerate(split_top_level(m["params"])):
        if method and i == 0:
            params.append("self")
            continue
        name, _, rest = p.partition(":")
        annotation, _, default = rest.partition(" = ")
        text = f"{name.strip()}: {translate(annotation.strip())}"
        if default:
            literal = re.fullmatch(r"-?\d+(\.\d+)?|True|False|None|'[^']*'", default.strip())
            text += f" = {default.strip() if literal else '...'}"
        params.append(text)
    return m["name"], ", ".join(params), translate(m["ret"])


def docstring(text: str, indent: str) -> list[str]:
    text = text.strip()
    if not text:
        return []
    if "\n" not in text:
        return [f'{indent}"""{text}"""']
    return [f'{indent}"""'] + [f"{indent}{line}".rstrip() for line in text.splitlines()] + [f'{indent}"""']


def routine(name: str, obj, indent: str, method: bool, decorators: tuple[str, ...] = ()) -> list[str]:
    """Stub lines of a function or method, one per overload."""
    doc = obj.__doc__ or ""
    lines = doc.splitlines()
    if len(lines) > 1 and lines[1] == "Overloaded function.":
        # "1. name(...) -> ...", then that overload's own description, up to the next one
        entries = re.split(r"\n\n(?=\d+\. )", doc.split("Overloaded function.", 1)[1].strip())
        overloads = [(e.splitlines()[0], "\n".join(e.splitlines()[1:])) for e in entries]
        decorators = decorators + ("@typing.overload",)
    else:
        overloads = [(lines[0], "\n".join(lines[1:]))]
    out = []
    for head, description in overloads:
        _, params, ret = parse_signature(head, method)
        out += [f"{indent}{d}" for d in decorators]
        body = docstring(description, indent + "    ")
        out.append(f"{indent}def {name}({params}) -> {ret}:" + ("" if body else " ..."))
        out += body
    return out


def prop(name: str, value: property, indent: str) -> list[str]:
    _, _, ret = parse_signature(value.fget.__doc__.splitlines()[0], method=False)
    body = docstring(value.__doc__ if value.__doc__ != value.fget.__doc__ else "", indent + "    ")
    out = [f"{indent}@property", f"{indent}def {name}(self) -> {ret}:" + ("" if body else " ...")] + body
    if value.fset is not None:
        _, params, _ = parse_signature(value.fset.__doc__.splitlines()[0], method=False)
        arg = split_top_level(params)[1].split(":", 1)[1].strip()
        out += [f"{indent}@{name}.setter", f"{indent}def {name}(self, value: {arg}) -> None: ..."]
    return out


def class_stub(name: str, cls: type) -> list[str]:
    if issubclass(cls, BaseException):
        return [f"class {name}({cls.__base__.__name__}): ...", ""]
    # a base of the module's own (the binding's py::class_<X, Base>) is named; pybind11's is not
    bases = [b.__name__ for b in cls.__bases__ if b.__module__ == cls.__module__]
    out = [f"class {name}({', '.join(bases)}):" if bases else f"class {name}:"] + docstring(cls.__doc__ or "", "    ")
    for attr, value in vars(cls).items():
        if attr.startswith("__") and attr not in DUNDERS or attr.startswith("_pybind11"):
            continue
        if isinstance(value, property):
            out += prop(attr, value, "    ")
        elif isinstance(value, staticmethod):
            out += routine(attr, value.__func__, "    ", method=False, decorators=("@staticmethod",))
        elif callable(value) and not isinstance(value, types.WrapperDescriptorType):
            # (a class without a constructor keeps object's __init__, a slot wrapper: no stub)
            out += routine(attr, value, "    ", method=True)
    return out + [""]


def render(module) -> str:
    out = [HEADER]
    for name, value in vars(module).items():
        if name.startswith("__"):
            continue
        if isinstance(value, type):
            out += class_stub(name, value)
        elif callable(value):
            out += routine(name, value, "", method=False) + [""]
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = ap.parse_args()
    text = render(importlib.import_module("ngramcache._core"))
    if not args.check:
        from ngramcache.files import atomic_open

        with atomic_open(STUB, "w", encoding="utf-8") as f:
            f.write(text)
        return 0
    current = STUB.read_text(encoding="utf-8") if STUB.exists() else ""
    if current == text:
        return 0
    sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                               "_core.pyi (committed)", "_core.pyi (from the module)"))
    print(f"\n{STUB} differs from the compiled module: run python scripts/gen_stubs.py", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
