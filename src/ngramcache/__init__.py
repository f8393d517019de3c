"""ngramcache: draft-free speculative decoding.

llama.cpp's n-gram lookup caches (context, dynamic, static), re-implemented in C++
with exact drafting, plus adapters that let a real model verify the drafts.
"""

from ._core import CacheFormatError
from .cache import NgramCache
from .draft import draft
from .static_table import StaticTable
from .stats import ReplayStats, replay
from .drafters import AdaptiveGate, CopyDrafter, Drafter, DraftStats, LookupDrafter, OracleDrafter

__version__ = "0.1.0"

__all__ = ["CacheFormatError", "NgramCache", "draft", "__version__"]
__all__ += ["ReplayStats", "replay"]
__all__ += ["AdaptiveGate", "CopyDrafter", "Drafter", "DraftStats", "LookupDrafter", "OracleDrafter"]
__all__ += ["StaticTable"]
