"""ngramcache: draft-free speculative decoding.

llama.cpp's n-gram lookup caches (context, dynamic, static), re-implemented in C++
with exact drafting, plus adapters that let a real model verify the drafts.
"""

from importlib.metadata import PackageNotFoundError, version

from ._core import CacheFormatError
from .cache import NgramCache
from .draft import draft
from .drafters import CopyDrafter, Drafter, DraftStats, LookupDrafter, OracleDrafter, PromptLookupDrafter
from .gate import AdaptiveGate
from .generation import PromptCache
from .static_table import StaticTable
from .stats import ReplayStats, replay
from .suffix import SuffixDrafter, SuffixStore
from . import speculative
from .speculative import NgramMapDrafter, NgramModDrafter, NgramSimpleDrafter

try:  # one source of truth: pyproject.toml
    __version__ = version("ngramcache")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AdaptiveGate", "CacheFormatError", "CopyDrafter", "DraftStats", "Drafter", "LookupDrafter",
    "NgramCache", "OracleDrafter", "ReplayStats", "StaticTable", "__version__", "draft", "replay",
    "PromptLookupDrafter", "SuffixDrafter", "SuffixStore",
    "NgramMapDrafter", "NgramModDrafter", "NgramSimpleDrafter", "PromptCache",
]
