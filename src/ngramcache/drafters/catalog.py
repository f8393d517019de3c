"""Every drafter by name, as the command line and the benchmarks choose them.

``make_drafter("suffix", n_draft=16, gate=gate)`` builds the drafter called ``suffix``
with its own defaults for every option not given; ``DRAFTERS`` maps each name to a one-line
description. Names follow llama.cpp's ``--spec-type`` where llama.cpp has the drafter
(``ngram-simple`` is ``simple`` here, ``ngram-map-k`` is ``map-k``, ``ngram-mod`` is ``mod``).
"""

from __future__ import annotations

import inspect

from ngramcache.drafters.base import CopyDrafter, LookupDrafter, PromptLookupDrafter
from ngramcache.drafters.llama_ngram import NgramMapDrafter, NgramModDrafter, NgramSimpleDrafter
from ngramcache.drafters.suffix import SuffixDrafter

__all__ = ["DRAFTERS", "DEFAULT_DRAFTER", "make_drafter", "drafter_class"]

DRAFTERS = {
    "copy": "copies of earlier spans of the sequence, else llama.cpp's lookup caches (CopyDrafter)",
    "suffix": "most frequent continuation of the longest suffix match, this request and earlier ones (SuffixDrafter)",
    "lookup": "llama.cpp's lookup decoding: context, dynamic and static n-gram caches (LookupDrafter)",
    "simple": "llama.cpp's ngram-simple: the newest earlier occurrence of the last size_n tokens (NgramSimpleDrafter)",
    "map-k": "llama.cpp's ngram-map-k: n-gram keys with accepted-length memory (NgramMapDrafter)",
    "map-k4v": "llama.cpp's ngram-map-k4v: keys with up to four counted values (NgramMapDrafter k4v=True)",
    "mod": "llama.cpp's ngram-mod: a hashed n-gram table shared across requests (NgramModDrafter)",
    "pld": "plain prompt lookup as in Hugging Face and vLLM (PromptLookupDrafter)",
}

#: the drafter ``generate`` and ``demo`` use unless told otherwise (bench/RESULTS.md)
DEFAULT_DRAFTER = "copy"

_CLASSES = {
    "copy": (CopyDrafter, {}),
    "suffix": (SuffixDrafter, {}),
    "lookup": (LookupDrafter, {}),
    "simple": (NgramSimpleDrafter, {}),
    "map-k": (NgramMapDrafter, {"k4v": False}),
    "map-k4v": (NgramMapDrafter, {"k4v": True}),
    "mod": (NgramModDrafter, {}),
    "pld": (PromptLookupDrafter, {}),
}


def drafter_class(name: str) -> type:
    """The class behind drafter ``name`` (ValueError naming the choices if unknown)."""
    return _lookup(name)[0]


def _lookup(name: str):
    if not isinstance(name, str) or name not in _CLASSES:
        raise ValueError(f"unknown drafter {name!r}: choose one of {', '.join(DRAFTERS)}")
    return _CLASSES[name]


def make_drafter(name: str, n_draft: int = 16, gate=None, **options):
    """The drafter called ``name``, proposing up to ``n_draft`` tokens per step, with an
    optional ``AdaptiveGate``; ``options`` are its constructor's own keyword arguments
    (e.g. ``static=`` for ``lookup`` and ``copy``, ``store=`` for ``suffix``,
    ``table=`` for ``mod``). An option the drafter does not take is a TypeError that
    names the drafter and the options it does take; None values are left out, so that
    callers can pass every option they know of."""
    cls, fixed = _lookup(name)
    params = inspect.signature(cls).parameters
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(k for k in given if k not in params or k in fixed)
    if unknown:
        takes = sorted(k for k in params if k not in fixed and k not in ("n_draft", "gate"))
        raise TypeError(f"drafter {name!r} takes no option {', '.join(unknown)} "
                        f"(its options: {', '.join(takes) or 'none'})")
    return cls(n_draft=n_draft, gate=gate, **fixed, **given)
