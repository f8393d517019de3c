"""A drafter's options, declared once: type, range, default and help.

Each drafter class lists its ``Option`` objects in ``OPTIONS`` and checks its constructor's
arguments with ``check_options``; the registry (``ngramcache.drafters.registry``) derives
the command line's flags, the server's request checks and the documentation from the same
objects, so that none of them can disagree with the constructor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from ngramcache.defaults import MAX_DRAFT

__all__ = ["Option", "OptionError", "OptionTypeError", "UnknownOptionError", "check_options", "MAX_DRAFT", "check_n_draft"]


class OptionError(ValueError):
    """A bad value for a drafter's option. ``param`` is the option's name (its constructor
    keyword), ``reason`` what is wrong with it; ``str()`` is both, e.g. ``"size_n must be 1
    to 1024, got 0"``."""

    def __init__(self, param: str, reason: str, message: str | None = None):
        super().__init__(message or f"{param} {reason}")
        self.param = param
        self.reason = reason


class OptionTypeError(OptionError, TypeError):
    """A value of the wrong type for an option (a ``TypeError`` too)."""


class UnknownOptionError(OptionError, TypeError):
    """An option the drafter does not take (a ``TypeError`` too, as for any unexpected
    keyword argument). ``param`` is the first unknown option."""


def check_n_draft(value) -> int:
    """``value`` as the most tokens a drafter proposes per step: 0 to ``MAX_DRAFT``."""
    return _check_int("n_draft", value, 0, MAX_DRAFT)


def _check_int(name: str, value, lo, hi) -> int:
    if type(value) is not int and (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))):
        raise OptionTypeError(name, f"must be an integer, got {type(value).__name__}")
    if lo is not None and hi is not None and not lo <= value <= hi:
        raise OptionError(name, f"must be {lo} to {hi}, got {value}")
    if lo is not None and value < lo:
        raise OptionError(name, f"must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise OptionError(name, f"must be <= {hi}, got {value}")
    return int(value)


def _check_real(name: str, value, lo, hi, lo_open: bool) -> float:
    if isinstance(value, (bool, np.bool_, str, bytes)) or not hasattr(value, "__float__"):
        raise OptionTypeError(name, f"must be a number, got {type(value).__name__}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise OptionTypeError(name, f"must be a number, got {type(value).__name__}") from None
    low_ok = lo is None or (x > lo if lo_open else x >= lo)
    if not (math.isfinite(x) and low_ok and (hi is None or x <= hi)):
        raise OptionError(name, f"must be a finite number {_real_range(lo, hi, lo_open)}, got {x}")
    return x


def _real_range(lo, hi, lo_open: bool) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    return f"<= {hi:g}" if hi is not None else ""


@dataclass(frozen=True)
class Option:
    """One option of a drafter: its constructor keyword ``name``, its ``type`` (int, float,
    str or bool), ``default``, a one-line ``help``, and the values allowed: ``lo``..``hi``
    for numbers (``lo_open``: ``lo`` itself excluded), ``choices`` for strings."""

    name: str
    type: type
    default: Any
    help: str
    lo: Any = None
    hi: Any = None
    lo_open: bool = False
    choices: tuple = ()

    def __post_init__(self):
        if self.type not in (int, float, str, bool):
            raise TypeError(f"option {self.name}: type must be int, float, str or bool, got {self.type!r}")
        self.check(self.default)  # a default outside its own range would be a broken declaration

    def check(self, value):
        """``value`` converted to the option's type, or ``OptionError`` naming the option."""
        if self.type is int:
            return _check_int(self.name, value, self.lo, self.hi)
        if self.type is float:
            return _check_real(self.name, value, self.lo, self.hi, self.lo_open)
        if self.type is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise OptionTypeError(self.name, f"must be a bool, got {type(value).__name__}")
            return bool(value)
        if not isinstance(value, str):
            raise OptionTypeError(self.name, f"must be one of {self.allowed()}, got {type(value).__name__}")
        if self.choices and value not in self.choices:
            raise OptionError(self.name, f"must be one of {self.allowed()}, got {value!r}")
        return value

    def allowed(self) -> str:
        """The values allowed, in words: ``1-1024``, ``>= 1``, ``(0, 1]``, ``'first' or 'recent'``."""
        if self.choices:
            return " or ".join(repr(c) for c in self.choices)
        if self.type is bool:
            return "true or false"
        if self.type is int:
            if self.lo is not None and self.hi is not None:
                return f"{self.lo}-{self.hi}"
            return f">= {self.lo}" if self.lo is not None else (f"<= {self.hi}" if self.hi is not None else "any")
        if self.lo is not None and self.hi is not None and not self.lo_open:
            return f"{self.lo:g}-{self.hi:g}"
        return _real_range(self.lo, self.hi, self.lo_open) or "any number"


def check_options(options: Iterable[Option], values: Mapping[str, Any],
                  ordered: Iterable[tuple[str, str]] = ()) -> dict:
    """Every value of ``values`` checked by the option of the same name, and each pair
    ``(a, b)`` of ``ordered`` holding ``a <= b`` (an option not in ``values`` counts with
    its default). A name with no option is an ``UnknownOptionError``."""
    by_name = {o.name: o for o in options}
    unknown = [k for k in values if k not in by_name]
    if unknown:
        raise UnknownOptionError(unknown[0], f"is not an option (options: {', '.join(sorted(by_name)) or 'none'})")
    out = {k: by_name[k].check(v) for k, v in values.items()}
    for a, b in ordered:
        va = out.get(a, by_name[a].default)
        vb = out.get(b, by_name[b].default)
        if va > vb:
            if a in out:
                raise OptionError(a, f"must be <= {b} ({b}={vb}), got {va}")
            raise OptionError(b, f"must be >= {a} ({a}={va}), got {vb}")
    return out
