"""Drafters: what proposes tokens for a model to verify."""

from ngramcache.drafters.base import (CopyDrafter, CoreSequenceDrafter, Drafter, DraftStats, LookupDrafter,
                                      OracleDrafter, PromptLookupDrafter, SequenceDrafter)
from ngramcache.drafters.llama_ngram import NgramMapDrafter, NgramModDrafter, NgramSimpleDrafter
from ngramcache.drafters.suffix import SuffixDrafter, SuffixStore

__all__ = ["CopyDrafter", "CoreSequenceDrafter", "Drafter", "DraftStats", "LookupDrafter", "OracleDrafter",
           "PromptLookupDrafter", "SequenceDrafter", "NgramMapDrafter", "NgramModDrafter",
           "NgramSimpleDrafter", "SuffixDrafter", "SuffixStore"]
