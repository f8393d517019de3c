"""Paired benchmarks of every drafter of ``ngramcache.drafters.catalog``: ``propose`` in a decoding
loop, beside the drafter's pure-Python reference model (tests/reference_*.py) on the same
text in the same run, and for ``pld`` beside llama-cpp-python's own prompt lookup too.
Both sides must propose the same tokens at every step.

The loop is a speculative decoder's: ``reset`` with a prompt (not timed), then per step
``propose`` up to N_DRAFT tokens and ``accept`` the proposed tokens that match the text
plus the text's next token (the model's own), until the text is used up. The text after
the prompt is first the document's own continuation (new text, few matches), then a
stretch copied from the middle of the prompt (as when a model quotes or edits what it
was given), so that every drafter both finds and misses.
"""

from __future__ import annotations

import numpy as np
import pytest

import reference as ref
import reference_speculative
from ngramcache.drafters.catalog import DRAFTERS, make_drafter
from pairs import BASELINE_ROUNDS, NGRAMCACHE_ROUNDS, baseline_side, ngramcache_side
from reference_copy import ReferenceCopyDrafter
from reference_prompt_lookup import prompt_lookup
from reference_suffix import RefSuffixDrafter

N_DRAFT = 16  # make_drafter's default

# (prompt tokens, tokens decoded after it) per drafter: the suffix reference is a brute
# force that rescans the text for every suffix length at every step, so it gets a shorter
# text to stay within about a second a round
SIZES = {"suffix": (512, 32)}
DEFAULT_SIZE = (2048, 256)


def sizes(name: str) -> tuple[int, int]:
    return SIZES.get(name, DEFAULT_SIZE)


def group(name: str) -> str:
    n_prompt, n_decoded = sizes(name)
    return f"propose: {name}, {n_prompt:,}-token prompt, {n_decoded} tokens decoded"


def decoding_text(document: np.ndarray, n_prompt: int, n_decoded: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, the tokens decoded after it)."""
    prompt = document[:n_prompt]
    n_new = n_decoded // 2
    copied = prompt[n_prompt // 2:][:n_decoded - n_new]
    return prompt, np.concatenate([document[n_prompt:n_prompt + n_new], copied])


def decode(drafter, arriving: np.ndarray) -> list:
    """The timed loop; returns every proposal."""
    proposals = []
    propose, accept = drafter.propose, drafter.accept
    text = arriving.tolist()
    have = 0
    while have < len(text):
        proposal = propose(N_DRAFT)
        proposals.append(proposal)
        guess = proposal.tolist() if isinstance(proposal, np.ndarray) else proposal
        n_right = 0
        while n_right < len(guess) and have + n_right < len(text) and guess[n_right] == text[have + n_right]:
            n_right += 1
        n_new = min(n_right + 1, len(text) - have)
        accept(arriving[have:have + n_new])
        have += n_new
    return proposals


def as_lists(proposals) -> list[list[int]]:
    return [[int(t) for t in p] for p in proposals]


# --- the reference models under the drafters' protocol (reset, propose, accept) ---------------

class ReferenceLookup:
    """llama.cpp's lookup drafter on tests/reference.py: a dict context cache kept current
    with the sequence, drafted from as ``common_ngram_cache_draft``."""

    def __init__(self, ngram_min: int, ngram_max: int):
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def reset(self, prompt) -> None:
        self.seq = [int(t) for t in prompt]
        self.context: dict = {}
        ref.update(self.context, self.seq, self.ngram_min, self.ngram_max)

    def propose(self, n: int) -> list[int]:
        return ref.draft(self.seq[-4:], n, self.context, ngram_min=self.ngram_min, ngram_max=self.ngram_max)

    def accept(self, tokens) -> None:
        new = [int(t) for t in tokens]
        self.seq += new
        # the new tokens' observations read at most 4 tokens before them
        ref.update(self.context, self.seq[-(len(new) + 4):], self.ngram_min, self.ngram_max, len(new))


class LlamaShapedReference:
    """A reference model with llama.cpp's calling shape (``begin(prompt)``,
    ``draft(prompt, id_last)``, ``accept(n_accepted)``; tests/reference_speculative.py)
    driven as ngramcache's drafters drive their core: the sequence's last token is
    ``id_last``, a proposal is the draft cut to ``n``, and the next ``accept`` reports the
    proposal's accepted prefix."""

    def __init__(self, model):
        self.model = model

    def reset(self, prompt) -> None:
        self.seq = [int(t) for t in prompt]
        self.model.begin(self.seq[:-1])
        self.proposal: list[int] | None = None

    def propose(self, n: int) -> list[int]:
        self.proposal = [int(t) for t in self.model.draft(self.seq[:-1], self.seq[-1])][:n]
        return self.proposal

    def accept(self, tokens) -> None:
        new = [int(t) for t in tokens]
        if self.proposal:
            k = 0
            while k < min(len(new), len(self.proposal)) and new[k] == self.proposal[k]:
                k += 1
            self.model.accept(k)
        self.proposal = None
        self.seq += new


class ReferencePromptLookup:
    """Prompt lookup by rescanning the whole sequence at every step, as Hugging Face and
    llama-cpp-python do (tests/reference_prompt_lookup.py)."""

    def __init__(self, max_ngram: int, min_ngram: int, match: str):
        self.max_ngram, self.min_ngram, self.match = max_ngram, min_ngram, match

    def reset(self, prompt) -> None:
        self.seq = [int(t) for t in prompt]

    def propose(self, n: int) -> list[int]:
        return prompt_lookup(self.seq, n, self.max_ngram, self.min_ngram, self.match)[0]

    def accept(self, tokens) -> None:
        self.seq += [int(t) for t in tokens]


def reference_for(name: str, drafter):
    """The reference model of catalog drafter ``name``, with ``drafter``'s settings."""
    d = drafter
    if name == "copy":
        return ReferenceCopyDrafter(n_draft=d.n_draft, ngram_min=d.ngram_min, ngram_max=d.ngram_max,
                                    min_match=d.min_match, max_match=d.max_match, max_candidates=d.max_candidates)
    if name == "suffix":
        return RefSuffixDrafter(n_draft=d.n_draft, max_depth=d.max_depth, alpha=d.alpha, min_prob=d.min_prob)
    if name == "lookup":
        return ReferenceLookup(d.ngram_min, d.ngram_max)
    if name == "simple":
        return LlamaShapedReference(reference_speculative.NgramSimple(d.size_n, d.size_m))
    if name in ("map-k", "map-k4v"):
        return LlamaShapedReference(reference_speculative.NgramMap(d.size_n, d.size_m, d.min_hits, d.k4v))
    if name == "mod":
        return LlamaShapedReference(reference_speculative.NgramMod(d.n_match, d.n_min, d.n_max))
    if name == "pld":
        return ReferencePromptLookup(d.max_ngram, d.min_ngram, d.match)
    raise LookupError(f"no reference model for drafter {name!r}: add one here")


def test_every_drafter_has_a_reference():
    # a drafter added to the catalog fails here until it has its pair
    for name in DRAFTERS:
        reference_for(name, make_drafter(name, n_draft=N_DRAFT))


def ready(drafter, prompt: np.ndarray, arriving: np.ndarray):
    """pedantic's setup: a drafter reset with the prompt, so no round times the reset."""
    drafter.reset(prompt)
    return (drafter, arriving), {}


def check_proposals(benchmark, got: list[list[int]], want: list[list[int]]) -> None:
    assert got == want
    n_proposals = sum(1 for p in want if p)
    assert n_proposals > 0, "the workload should draft: it measures drafting"
    benchmark.extra_info.update(steps=len(want), proposals=n_proposals, drafted_tokens=sum(map(len, want)))


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_propose_reference(benchmark, name, document, baseline_results):
    prompt, arriving = decoding_text(document, *sizes(name))
    baseline_side(benchmark, group(name), "reference model")
    want = as_lists(benchmark.pedantic(
        decode, setup=lambda: ready(reference_for(name, make_drafter(name, n_draft=N_DRAFT)), prompt, arriving),
        rounds=BASELINE_ROUNDS))
    baseline_results.keep(group(name), want)
    drafter = make_drafter(name, n_draft=N_DRAFT)
    drafter.reset(prompt)
    check_proposals(benchmark, as_lists(decode(drafter, arriving)), want)


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_propose_ngramcache(benchmark, name, document, baseline_results):
    prompt, arriving = decoding_text(document, *sizes(name))
    ngramcache_side(benchmark, group(name), f"ngramcache {name}")
    got = as_lists(benchmark.pedantic(decode, setup=lambda: ready(make_drafter(name, n_draft=N_DRAFT), prompt,
                                                                  arriving),
                                      rounds=NGRAMCACHE_ROUNDS, warmup_rounds=1))

    def reference_run():
        reference = reference_for(name, make_drafter(name, n_draft=N_DRAFT))
        reference.reset(prompt)
        return as_lists(decode(reference, arriving))

    check_proposals(benchmark, got, baseline_results.get(group(name), reference_run))


class LlamaCppPromptLookup:
    """llama-cpp-python's ``LlamaPromptLookupDecoding`` (stateless: it rescans the whole
    sequence with numpy at every call) under the drafters' protocol."""

    def __init__(self, max_ngram: int, n_draft: int, capacity: int):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.lookup = LlamaPromptLookupDecoding(max_ngram_size=max_ngram, num_pred_tokens=n_draft)
        # a buffer filled in place: handing it a slice costs nothing, so the peer is timed
        # on its own scan, not on building its input
        self.buf = np.empty(capacity, dtype=np.intc)
        self.n = 0

    def reset(self, prompt) -> None:
        self.n = len(prompt)
        self.buf[:self.n] = prompt

    def propose(self, n: int) -> np.ndarray:
        return self.lookup(self.buf[:self.n])[:n]

    def accept(self, tokens) -> None:
        self.buf[self.n:self.n + len(tokens)] = tokens
        self.n += len(tokens)


def test_propose_pld_llama_cpp_python(benchmark, document, baseline_results):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (extra llama)")
    prompt, arriving = decoding_text(document, *sizes("pld"))
    pld = make_drafter("pld", n_draft=N_DRAFT)
    # llama-cpp-python's lookup is ngramcache's pld with match="first" and min_ngram 1
    assert (pld.match, pld.min_ngram) == ("first", 1)
    baseline_side(benchmark, group("pld"), "llama-cpp-python LlamaPromptLookupDecoding")
    got = as_lists(benchmark.pedantic(
        decode, setup=lambda: ready(LlamaCppPromptLookup(pld.max_ngram, N_DRAFT, prompt.size + arriving.size),
                                    prompt, arriving),
        rounds=BASELINE_ROUNDS))
    pld.reset(prompt)
    check_proposals(benchmark, got, as_lists(decode(pld, arriving)))
