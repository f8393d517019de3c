"""Prompt lookup by rescanning the whole sequence, the way Hugging Face's
PromptLookupCandidateGenerator and llama-cpp-python's LlamaPromptLookupDecoding do it
(with vLLM's min_ngram, and the newest occurrence instead of the first for
match="recent"): the slow oracle of ``ngramcache.PromptLookupDrafter``."""

from __future__ import annotations


def prompt_lookup(tokens, n_draft: int, max_ngram: int = 3, min_ngram: int = 1,
                  match: str = "first") -> tuple[list[int], int]:
    """(proposed tokens, size of the matched n-gram or 0) for the sequence ``tokens``."""
    seq = list(tokens)
    n = len(seq)
    for size in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        suffix = seq[n - size :]
        starts = [i for i in range(n - size + 1) if seq[i : i + size] == suffix]
        if match == "recent":
            starts.reverse()
        for i in starts:
            begin, end = i + size, min(i + size + n_draft, n)
            if begin < end:
                return seq[begin:end], size
    return [], 0
