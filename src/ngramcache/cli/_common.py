"""What every command shares: how a command is declared, its errors, the output flags and
the one way results are printed (a table on stdout, or JSON with --json)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Iterable, Sequence


class UsageError(Exception):
    """Bad flags or arguments: exit status 2, after the command's usage line."""


class InputError(UsageError):
    """The flags are right but what they name cannot be used (a text too short to replay, an
    empty prompt, a model without a chat template): exit status 2, after a pointer to
    ``--help`` instead of the usage."""


class RunError(Exception):
    """A runtime failure already phrased for the user: exit status 1."""


def command_parser(sub, name: str, run: Callable, *, help: str, description: str,
                   epilog: str | None = None) -> argparse.ArgumentParser:
    """A subcommand's parser. ``help`` is its one line in ``ngramcache --help`` (the
    parser's default ``summary``); ``args._parser`` lets the error path print its usage."""
    p = sub.add_parser(name, description=description, epilog=epilog,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(run=run, _parser=p, summary=help)
    return p


def add_output_flags(p, what: str = "the summary", group=None, json_help: str | None = None) -> None:
    """``--json`` and ``-q/--quiet``, in ``group`` (a command's own output group) or a new one.
    ``--json`` says it prints ``what`` as one JSON object on stdout, or ``json_help`` whole."""
    out = p.add_argument_group("output") if group is None else group
    out.add_argument("--json", action="store_true",
                     help=json_help or f"print {what} as one JSON object on stdout instead")
    out.add_argument("-q", "--quiet", action="store_true", help="no progress bars or notes on stderr")


def check_ranges(args, rules: Iterable[tuple]) -> None:
    """``(dest, lowest, message)`` or ``(dest, lowest, message, highest)`` for each integer
    flag: a value outside ``lowest..highest`` is a usage error saying ``message, got
    VALUE``; None (flag not given) passes."""
    for dest, lowest, message, *highest in rules:
        value = getattr(args, dest)
        if value is not None and (value < lowest or (highest and value > highest[0])):
            raise UsageError(f"{message}, got {value}")


def note(args, msg: str) -> None:
    if not getattr(args, "quiet", False):
        print(msg, file=sys.stderr)


class Timer:
    """Wall-clock seconds per stage, in the order the stages ran."""

    def __init__(self):
        self.start = time.perf_counter()
        self.stages: dict[str, float] = {}

    def stage(self, name: str):
        return _Stage(self, name)

    @property
    def total(self) -> float:
        return time.perf_counter() - self.start


class _Stage:
    def __init__(self, timer: Timer, name: str):
        self.timer, self.name = timer, name

    def __enter__(self):
        self.t = time.perf_counter()

    def __exit__(self, *exc):
        stages = self.timer.stages
        stages[self.name] = stages.get(self.name, 0.0) + time.perf_counter() - self.t


# -- results --------------------------------------------------------------------------------

Rows = Sequence[tuple[str, str]]


def format_rows(rows: Rows, indent: str = "  ", sep: str = "  ") -> str:
    """label/value lines, the labels padded to one width."""
    width = max(len(label) for label, _ in rows)
    return "".join(f"{indent}{label:<{width}}{sep}{value}\n" for label, value in rows)


def format_columns(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A column table: a header, a rule, then the rows; the first column left-aligned,
    the others right-aligned."""
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]

    def line(cells) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)]) + "\n"


def emit(args, result: dict, *, title: str | None = None, rows: Rows = (), columns=None, text: str = "",
         indent: str = "  ", sep: str = "  ", file=None, json_indent: int | None = None) -> int:
    """Print a command's result and return exit status 0: with --json, ``result`` as one
    JSON object on stdout; else ``title``, then ``rows`` (label, value) or ``columns``
    (head, body), then ``text``, on ``file`` (default stdout)."""
    if getattr(args, "json", False):
        print(json.dumps(result, indent=json_indent))
        return 0
    parts = [] if title is None else [title + "\n"]
    if rows:
        parts.append(format_rows(rows, indent, sep))
    if columns is not None:
        parts.append(format_columns(*columns))
    parts.append(text)
    out = sys.stdout if file is None else file
    out.write("".join(parts))
    out.flush()
    return 0


def check_output_path(out: str, inputs: Sequence[str] = ()) -> None:
    """Fail before the work, not after it, for an output that cannot be written."""
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise RunError(f"{out}: the directory {parent} does not exist")
    if os.path.isdir(out):
        raise RunError(f"{out}: is a directory")
    for i in inputs:
        try:
            if os.path.exists(i) and os.path.exists(out) and os.path.samefile(i, out):
                raise UsageError(f"{out}: the output would overwrite the input {i}")
        except OSError:
            pass
