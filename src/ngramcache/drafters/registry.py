"""Every drafter by name, each declared once by a ``DrafterSpec``.

A spec names a drafter class, the constructor arguments its name fixes (``map-k4v`` is
``NgramMapDrafter`` with ``k4v=True``), the shared state it reads or learns into across
requests, and how its options appear on the command line. The options themselves (type,
range, default, help) are the class's ``OPTIONS``, which its constructor checks, so
nothing derived from a spec can disagree with the constructor. Derived from the specs:

* the catalog: ``make_drafter``, ``DRAFTERS`` (name -> description, live), ``drafter_class``,
  ``DEFAULT_DRAFTER`` (``ngramcache.drafters.catalog`` is a view of these);
* the command line's ``--drafter`` and each drafter's flags (``ngramcache.cli._drafters``);
* ``stats --drafter``: ``name_of(drafter)`` names a drafter object by its spec;
* the options table of docs/drafters.md: ``options_table()``.

For a server:

* ``spec(name)`` is the spec of drafter ``name`` (``UnknownDrafterError``, a ValueError
  naming the choices, if there is none);
* ``spec(name).validate_options(values)`` checks a request's options for that drafter and
  returns them converted; a bad or unknown one raises ``OptionError`` (a ValueError;
  ``UnknownOptionError`` is also a TypeError) whose ``param`` is the option's name;
* ``spec(name).shared_kwargs({kind: object})`` picks, from the shared objects a server
  keeps, those the drafter reads, as its constructor's keywords; ``shared_state_kinds()``
  lists the kinds (``DYNAMIC``, ``STATIC``, ``SUFFIX_STORE``, ``MOD_TABLE``) and
  ``spec(name).shared_state`` says which the drafter reads and which it writes itself.

``register(spec)`` adds a drafter (every one of the above finds it at once) and
``unregister(name)`` removes it. A spec's class is built as ``cls(n_draft=...,
**fixed, **options, **shared)``; ``SequenceDrafter`` is the base for one written in Python,
and ``DrafterSpec.compiled`` makes the class of one whose work is a compiled class alone
(docs/drafters.md, "Adding a compiled drafter").
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterator

from ngramcache.drafters.base import CoreSequenceDrafter
from ngramcache.drafters.copy import CopyDrafter
from ngramcache.drafters.llama_ngram import NgramMapDrafter, NgramModDrafter, NgramSimpleDrafter
from ngramcache.drafters.lookup import LookupDrafter
from ngramcache.defaults import N_DRAFT
from ngramcache.drafters.options import MAX_DRAFT, Option, OptionError, UnknownOptionError, check_options
from ngramcache.drafters.prompt_lookup import PromptLookupDrafter
from ngramcache.drafters.suffix import SuffixDrafter

__all__ = ["DrafterSpec", "Shared", "UnknownDrafterError", "register", "unregister", "spec", "specs",
           "make_drafter", "compiled_drafter", "drafter_class", "name_of", "options_table", "shared_state_kinds",
           "DRAFTERS",
           "DEFAULT_DRAFTER", "DYNAMIC", "embed_options_table", "STATIC", "SUFFIX_STORE", "MOD_TABLE", "MAX_DRAFT",
           "OptionError", "UnknownOptionError"]

# kinds of state a drafter can share across requests
DYNAMIC = "dynamic"
STATIC = "static"
SUFFIX_STORE = "suffix_store"
MOD_TABLE = "mod_table"
_KINDS = {
    DYNAMIC: "an NgramCache of the n-grams of earlier requests (llama.cpp's dynamic cache)",
    STATIC: "a read-only static table: a StaticTable of 2-grams or an NgramCache (llama.cpp's static cache)",
    SUFFIX_STORE: "a SuffixStore of earlier requests",
    MOD_TABLE: "an NgramModTable (ngram-mod's hashed table)",
}

#: the drafter ``generate`` and ``demo`` use unless told otherwise (bench/RESULTS.md)
DEFAULT_DRAFTER = "copy"


class UnknownDrafterError(ValueError):
    """A drafter name that is not registered; the message names the choices."""


def shared_state_kinds() -> dict[str, str]:
    """Each kind of shared state a spec can name, with what object it is."""
    return dict(_KINDS)


@dataclass(frozen=True)
class Shared:
    """Shared state a drafter takes: an object of ``kind`` (one of ``shared_state_kinds()``)
    passed as its constructor's ``keyword``; ``writes``: the drafter adds what it sees to it
    (otherwise it only reads it)."""

    kind: str
    keyword: str
    writes: bool = False

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"shared state kind {self.kind!r} is not one of {', '.join(_KINDS)}")


def _words(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True, eq=False)
class DrafterSpec:
    """One drafter: its ``name`` (``--drafter NAME``), a one-line ``description``, its
    class ``cls``, the constructor arguments the name ``fixed``, the ``shared_state`` it
    takes (``Shared`` entries), and how its options read on the command line: each is
    ``flag_prefix`` + the option's name with dashes (default prefix ``--NAME-``), its help
    starting with ``label`` (default ``NAME``). Its options are ``cls.OPTIONS`` less the
    fixed ones; pairs of ``cls.ORDERED`` must be in order."""

    name: str
    description: str
    cls: type
    fixed: Mapping[str, Any] = field(default_factory=dict)
    shared_state: tuple[Shared, ...] = ()
    flag_prefix: str | None = None
    label: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or not all(c.isalnum() or c == "-" for c in self.name):
            raise ValueError(f"a drafter name is letters, digits and dashes, got {self.name!r}")
        if not isinstance(self.cls, type):
            raise TypeError(f"drafter {self.name!r}: cls must be a class, got {type(self.cls).__name__}")
        object.__setattr__(self, "fixed", dict(check_options(getattr(self.cls, "OPTIONS", ()), self.fixed)))
        object.__setattr__(self, "shared_state", tuple(self.shared_state))
        if self.flag_prefix is None:
            object.__setattr__(self, "flag_prefix", f"--{self.name}-")
        if self.label is None:
            object.__setattr__(self, "label", self.name)

    @property
    def options(self) -> tuple[Option, ...]:
        """The options a caller may set (the class's, less those the name fixes)."""
        return tuple(o for o in getattr(self.cls, "OPTIONS", ()) if o.name not in self.fixed)

    @property
    def shared_keywords(self) -> tuple[str, ...]:
        return tuple(s.keyword for s in self.shared_state)

    def _check(self, values: Mapping[str, Any], allowed: tuple[str, ...]) -> dict:
        unknown = [k for k in values if k not in allowed]
        if unknown:
            takes = ", ".join(sorted(allowed)) or "none"
            raise UnknownOptionError(unknown[0], "is not an option of this drafter",
                                     f"drafter {self.name!r} takes no option {', '.join(map(str, unknown))} "
                                     f"(its options: {takes})")
        return check_options(self.options, values, getattr(self.cls, "ORDERED", ()))

    def validate_options(self, values: Mapping[str, Any]) -> dict:
        """``values`` (option name -> value, e.g. from a request) checked and converted;
        ``OptionError`` naming the first bad one (``UnknownOptionError`` for a name that is
        not one of ``options``)."""
        if not isinstance(values, Mapping):
            raise OptionError("options", f"must be an object of option names and values, got {type(values).__name__}")
        return self._check(values, tuple(o.name for o in self.options))

    def make(self, n_draft: int = N_DRAFT, **options):
        """The drafter, proposing up to ``n_draft`` tokens; ``options``: its options and
        shared state by keyword (None values left out)."""
        given = {k: v for k, v in options.items() if v is not None}
        shared = {k: v for k, v in given.items() if k in self.shared_keywords}
        scalar = {k: v for k, v in given.items() if k not in shared}
        checked = self._check(scalar, tuple(o.name for o in self.options) + self.shared_keywords)
        return self.cls(n_draft=n_draft, **self.fixed, **checked, **shared)

    def shared_kwargs(self, available: Mapping[str, Any]) -> dict:
        """The constructor keywords for the shared objects in ``available`` (kind -> object)
        this drafter takes."""
        return {s.keyword: available[s.kind] for s in self.shared_state if s.kind in available}

    def flag(self, option: Option) -> str:
        """The command-line flag of ``option``."""
        return self.flag_prefix + option.name.replace("_", "-")

    def help(self, option: Option) -> str:
        """The command-line help of ``option``: what it sets, its values and its default."""
        return f"{self.label}: {option.help} ({option.allowed()}; default {_words(option.default)})"

    def matches(self, drafter) -> bool:
        """Whether ``drafter`` is an object of this spec: its class, with the fixed arguments."""
        return type(drafter) is self.cls and all(getattr(drafter, k, None) == v for k, v in self.fixed.items())

    def __repr__(self) -> str:
        return f"<DrafterSpec {self.name!r}: {self.cls.__name__}>"

    @classmethod
    def compiled(cls, name: str, description: str, core: type, options: tuple[Option, ...] = (),
                 ordered: tuple[tuple[str, str], ...] = (), source=None, **spec_fields) -> "DrafterSpec":
        """The spec of a drafter whose whole work is the compiled class ``core`` (bound with
        ``bind_sequence_drafter``): its class is ``compiled_drafter(core, options, ordered,
        source)``; ``spec_fields`` are the rest of ``DrafterSpec``'s fields."""
        return cls(name, description, compiled_drafter(core, options, ordered, source), **spec_fields)


def compiled_drafter(core: type, options: tuple[Option, ...] = (), ordered: tuple[tuple[str, str], ...] = (),
                     source=None) -> type:
    """A ``CoreSequenceDrafter`` class over ``core``, a class of the compiled core of the
    sequence protocol whose constructor keywords are the names of ``options``: its
    constructor takes ``n_draft`` and the options by keyword, checks them (and the pairs
    ``(a, b)`` of ``ordered``, ``a <= b``) and builds ``core`` with every option's value.
    ``source``: the ``Source`` of its proposals when ``core`` does not say (None: the base's).
    A drafter that reads shared state (a cache, a store) writes its own class instead."""
    names = tuple(o.name for o in options)

    def __init__(self, n_draft: int = N_DRAFT, **values):
        CoreSequenceDrafter.__init__(self, n_draft)
        self._set_options(**({o.name: o.default for o in options} | values))
        self._impl = core(**{n: getattr(self, n) for n in names})

    # the signature the options make, for help() and for whatever introspects constructors
    keyword = inspect.Parameter.KEYWORD_ONLY
    __init__.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
         inspect.Parameter("n_draft", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=N_DRAFT, annotation=int)]
        + [inspect.Parameter(o.name, keyword, default=o.default, annotation=o.type) for o in options])
    attrs = {"OPTIONS": tuple(options), "ORDERED": tuple(ordered), "__init__": __init__,
             "__doc__": core.__doc__, "__module__": __name__, "__qualname__": core.__name__}
    if source is not None:
        attrs["_SOURCE"] = source
    return type(core.__name__, (CoreSequenceDrafter,), attrs)


_lock = threading.Lock()
_specs: dict[str, DrafterSpec] = {}


def register(new: DrafterSpec, *, replace: bool = False) -> DrafterSpec:
    """Add drafter ``new.name`` (``replace``: over one of the same name). Every name and
    flag must be its own: a clash is a ValueError."""
    if not isinstance(new, DrafterSpec):
        raise TypeError(f"register takes a DrafterSpec, got {type(new).__name__}")
    with _lock:
        if new.name in _specs and not replace:
            raise ValueError(f"a drafter named {new.name!r} is registered already")
        taken = {s.flag(o): s.name for s in _specs.values() if s.name != new.name for o in s.options}
        for o in new.options:
            if new.flag(o) in taken:
                raise ValueError(f"drafter {new.name!r}: flag {new.flag(o)} belongs to drafter {taken[new.flag(o)]!r}")
        _specs[new.name] = new
    return new


def unregister(name: str) -> DrafterSpec:
    """Remove drafter ``name``; returns its spec."""
    with _lock:
        if name not in _specs:
            raise _unknown(name)
        return _specs.pop(name)


def _unknown(name) -> UnknownDrafterError:
    return UnknownDrafterError(f"unknown drafter {name!r}: choose one of {', '.join(_specs)}")


def spec(name: str) -> DrafterSpec:
    """The spec of drafter ``name`` (``UnknownDrafterError`` naming the choices if none)."""
    try:
        return _specs[name]
    except (KeyError, TypeError):
        raise _unknown(name) from None


def specs() -> tuple[DrafterSpec, ...]:
    """Every spec, in the order registered."""
    return tuple(_specs.values())


def make_drafter(name: str, n_draft: int = N_DRAFT, **options):
    """The drafter called ``name``, proposing up to ``n_draft`` tokens per step (0 to
    ``MAX_DRAFT``); ``options`` are its own options and
    its shared state by keyword (e.g. ``static=`` for ``lookup`` and ``copy``, ``store=``
    for ``suffix``, ``table=`` for ``mod``). None values are left out, so that callers can
    pass every option they know of. An option the drafter does not take is an
    ``UnknownOptionError`` (a TypeError) naming the drafter and the options it takes; a
    bad value an ``OptionError`` (a ValueError) naming the option."""
    return spec(name).make(n_draft, **options)


def drafter_class(name: str) -> type:
    """The class behind drafter ``name`` (ValueError naming the choices if unknown)."""
    return spec(name).cls


def name_of(drafter) -> str | None:
    """The name of the spec ``drafter`` is an object of (its class and fixed arguments),
    or None."""
    for s in specs():
        if s.matches(drafter):
            return s.name
    return None


class _Names(Mapping):
    """Name -> description of every registered drafter, in registration order, live."""

    def __getitem__(self, name: str) -> str:
        if name not in _specs:
            raise KeyError(name)
        return _specs[name].description

    def __iter__(self) -> Iterator[str]:
        return iter(list(_specs))

    def __len__(self) -> int:
        return len(_specs)

    def __repr__(self) -> str:
        return f"DRAFTERS({dict(self)!r})"


DRAFTERS: Mapping[str, str] = _Names()


def options_table() -> str:
    """Every registered drafter's options as a Markdown table (docs/drafters.md embeds it)."""
    rows = ["| `--drafter` | option | flag | values | default | what it sets |", "|---|---|---|---|---|---|"]
    for s in specs():
        for o in s.options:
            rows.append(f"| `{s.name}` | `{o.name}` | `{s.flag(o)}` | {o.allowed().replace('|', '/')} | "
                        f"{_words(o.default)} | {o.help} |")
    return "\n".join(rows) + "\n"


# the built-in drafters, in the order the command line lists them
for _spec in (
    DrafterSpec("copy", "copies of earlier spans of the sequence, else llama.cpp's lookup caches (CopyDrafter)",
                CopyDrafter, shared_state=(Shared(DYNAMIC, "dynamic"), Shared(STATIC, "static")), label="copy drafter"),
    DrafterSpec("suffix", "most frequent continuation of the longest suffix match, this request and earlier ones "
                "(SuffixDrafter)", SuffixDrafter, shared_state=(Shared(SUFFIX_STORE, "store", writes=True),),
                label="suffix drafter"),
    DrafterSpec("lookup", "llama.cpp's lookup decoding: context, dynamic and static n-gram caches (LookupDrafter)",
                LookupDrafter, shared_state=(Shared(DYNAMIC, "dynamic"), Shared(STATIC, "static")),
                label="lookup"),
    DrafterSpec("simple", "llama.cpp's ngram-simple: the newest earlier occurrence of the last size_n tokens "
                "(NgramSimpleDrafter)", NgramSimpleDrafter, flag_prefix="--spec-ngram-simple-", label="ngram-simple"),
    DrafterSpec("map-k", "llama.cpp's ngram-map-k: n-gram keys with accepted-length memory (NgramMapDrafter)",
                NgramMapDrafter, fixed={"k4v": False}, flag_prefix="--spec-ngram-map-k-", label="ngram-map-k"),
    DrafterSpec("map-k4v", "llama.cpp's ngram-map-k4v: keys with up to four counted values (NgramMapDrafter "
                "k4v=True)", NgramMapDrafter, fixed={"k4v": True}, flag_prefix="--spec-ngram-map-k4v-",
                label="ngram-map-k4v"),
    DrafterSpec("mod", "llama.cpp's ngram-mod: a hashed n-gram table shared across requests (NgramModDrafter)",
                NgramModDrafter, shared_state=(Shared(MOD_TABLE, "table", writes=True),),
                flag_prefix="--spec-ngram-mod-", label="ngram-mod"),
    DrafterSpec("pld", "plain prompt lookup as in Hugging Face and vLLM (PromptLookupDrafter)", PromptLookupDrafter,
                label="prompt lookup"),
):
    register(_spec)
del _spec


_TABLE_BEGIN = "<!-- options table: begin"
_TABLE_END = "<!-- options table: end -->"


def embed_options_table(text: str) -> str:
    """``text`` (a Markdown document) with the lines between its options-table markers
    (``<!-- options table: begin ... -->`` and ``<!-- options table: end -->``) replaced by
    ``options_table()``; ValueError if the markers are missing."""
    begin = text.find(_TABLE_BEGIN)
    end = text.find(_TABLE_END, begin)
    if begin < 0 or end < 0:
        raise ValueError(f"no options table markers ({_TABLE_BEGIN} ... -->, {_TABLE_END})")
    body = text.index("\n", begin) + 1
    return text[:body] + options_table() + text[end:]

