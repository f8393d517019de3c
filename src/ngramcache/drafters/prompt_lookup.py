"""Plain prompt lookup decoding, as Hugging Face, llama-cpp-python and vLLM do it."""

from __future__ import annotations

from ngramcache import _core
from ngramcache.drafters.base import CoreSequenceDrafter, Source
from ngramcache.defaults import PROMPT_LOOKUP_N_DRAFT
from ngramcache.drafters.options import Option

__all__ = ["PromptLookupDrafter", "PROMPT_LOOKUP_MAX_NGRAM"]

#: the longest n-gram PromptLookupDrafter matches (the core's PromptLookupDrafter::kMaxNgram)
PROMPT_LOOKUP_MAX_NGRAM = 64

MAX_NGRAM = Option("max_ngram", int, 3, "longest n-gram matched", lo=1, hi=PROMPT_LOOKUP_MAX_NGRAM)
MIN_NGRAM = Option("min_ngram", int, 1, "shortest n-gram matched", lo=1, hi=PROMPT_LOOKUP_MAX_NGRAM)
MATCH = Option("match", str, "first", "which earlier occurrence: 'first' (as Hugging Face, llama-cpp-python and "
               "vLLM) or 'recent' (the newest, as ngram-simple)", choices=("first", "recent"))


class PromptLookupDrafter(CoreSequenceDrafter):
    """Plain prompt lookup decoding, as Hugging Face (``prompt_lookup_num_tokens``),
    llama-cpp-python (``LlamaPromptLookupDecoding``) and vLLM (``method="ngram"``) do it.

    For an n-gram size from ``max_ngram`` down to ``min_ngram``, it looks for an earlier
    occurrence of the last ``size`` tokens and proposes the (up to ``n_draft``) tokens
    that followed it; the longest size with an occurrence wins. ``match="first"`` takes
    the earliest occurrence in the sequence, as those three do, so its proposals are
    theirs token for token; ``match="recent"`` the newest. An occurrence may overlap the
    newest tokens themselves, and a continuation stops at the end of the sequence (it can
    be shorter than ``n_draft``).

    The peers rescan the whole sequence at every step; here an index per n-gram size is
    kept current as tokens arrive, so a step costs O(max_ngram^2 + n_draft) whatever the
    length of the sequence. A proposal's confidence is the size of the matched n-gram.
    """

    _SOURCE = Source.COPY
    OPTIONS = (MAX_NGRAM, MIN_NGRAM, MATCH)
    ORDERED = (("min_ngram", "max_ngram"),)

    def __init__(self, max_ngram: int = MAX_NGRAM.default, min_ngram: int = MIN_NGRAM.default,
                 n_draft: int = PROMPT_LOOKUP_N_DRAFT, match: str = MATCH.default):
        super().__init__(n_draft)
        self._set_options(max_ngram=max_ngram, min_ngram=min_ngram, match=match)
        self._impl = _core.PromptLookupDrafter(self.max_ngram, self.min_ngram, self.match == "recent")

    def __repr__(self) -> str:
        return (f"<PromptLookupDrafter max_ngram={self.max_ngram} min_ngram={self.min_ngram} "
                f"match={self.match!r} n_draft={self.n_draft}, {self.tokens.size} tokens>")
