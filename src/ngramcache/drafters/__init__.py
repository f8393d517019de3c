"""Drafters: what proposes tokens for a model to verify. ``registry`` names them."""

from ngramcache.drafters.base import CoreSequenceDrafter, Drafter, DraftStats, SequenceDrafter
from ngramcache.drafters.copy import CopyDrafter
from ngramcache.drafters.llama_ngram import NgramMapDrafter, NgramModDrafter, NgramSimpleDrafter
from ngramcache.drafters.lookup import LookupDrafter
from ngramcache.drafters.options import MAX_DRAFT, Option, OptionError, UnknownOptionError
from ngramcache.drafters.oracle import OracleDrafter
from ngramcache.drafters.prompt_lookup import PromptLookupDrafter
from ngramcache.drafters.registry import DrafterSpec, Shared, make_drafter, register, unregister
from ngramcache.drafters.suffix import SuffixDrafter, SuffixStore

__all__ = ["CopyDrafter", "CoreSequenceDrafter", "Drafter", "DraftStats", "DrafterSpec", "LookupDrafter",
           "MAX_DRAFT", "NgramMapDrafter", "NgramModDrafter", "NgramSimpleDrafter", "Option", "OptionError",
           "OracleDrafter", "PromptLookupDrafter", "SequenceDrafter", "Shared", "SuffixDrafter", "SuffixStore",
           "UnknownOptionError", "make_drafter", "register", "unregister"]
