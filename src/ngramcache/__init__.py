"""ngramcache: draft-free speculative decoding.

llama.cpp's n-gram lookup caches (context, dynamic, static), re-implemented in C++
with exact drafting, plus adapters that let a real model verify the drafts.
"""

from importlib.metadata import PackageNotFoundError, version

from ngramcache._core import CacheFormatError
from ngramcache.cache import NgramCache
from ngramcache.draft import draft
from ngramcache.drafters import CopyDrafter, Drafter, DraftStats, LookupDrafter, OracleDrafter, PromptLookupDrafter
from ngramcache.decoding.gate import Gate, GatedDrafter, GateSettings
from ngramcache.decoding.loop import PromptCache
from ngramcache.static_table import StaticTable
from ngramcache.replay_stats import ReplayStats
from ngramcache.replays import replay
from ngramcache.drafters.suffix import SuffixDrafter, SuffixStore
from ngramcache.drafters.llama_ngram import NgramMapDrafter, NgramModDrafter, NgramSimpleDrafter

try:  # one source of truth: pyproject.toml
    __version__ = version("ngramcache")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "CacheFormatError", "CopyDrafter", "Gate", "GatedDrafter", "GateSettings", "DraftStats", "Drafter", "LookupDrafter",
    "NgramCache", "OracleDrafter", "ReplayStats", "StaticTable", "__version__", "draft", "replay",
    "PromptLookupDrafter", "SuffixDrafter", "SuffixStore",
    "NgramMapDrafter", "NgramModDrafter", "NgramSimpleDrafter", "PromptCache",
]
