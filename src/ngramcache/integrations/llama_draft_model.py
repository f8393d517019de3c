"""ngramcache's drafters inside llama-cpp-python's own speculative loop.

``LlamaDrafter(drafter)`` is any ``Drafter`` as a ``llama_cpp.llama_speculative.LlamaDraftModel``,
so ``Llama(model_path, draft_model=LlamaDrafter(...))`` works unchanged with
``create_completion``, ``create_chat_completion`` and llama-cpp-python's server (build that
``Llama`` with ``ngramcache.integrations.llama.make_llama``: see its "known bug").
``generate_llama_cpp`` runs llama-cpp-python's own loop measured with the clocks of
``ngramcache.decoding.loop.generate``, for comparisons; ``CountingDraftModel`` counts the
drafted and accepted tokens of any draft model there.
"""

from __future__ import annotations

import abc
import functools
import time

import numpy as np

try:
    from llama_cpp.llama_speculative import LlamaDraftModel
except ImportError:  # the module imports without the extra; using it needs it

    class LlamaDraftModel(abc.ABC):  # type: ignore[no-redef]
        """Stand-in for llama_cpp.llama_speculative.LlamaDraftModel."""

        @abc.abstractmethod
        def __call__(self, input_ids, /, **kwargs): ...

from ngramcache._validate import check_int
from ngramcache.decoding.loop import GenerationResult
from ngramcache._prefix import accepted_prefix
from ngramcache.drafters.base import Drafter
from ngramcache.integrations.follower import Following, SequenceFollower
from ngramcache.integrations.llama_backend import LlamaBackend, llama_cpp, need_llama

__all__ = ["LlamaDraftModel", "LlamaDrafter", "CountingDraftModel", "generate_llama_cpp", "check_llama"]


def check_llama(llm) -> None:
    """Raise ValueError if ``llm`` has a draft model but would hit llama-cpp-python
    0.3.36's ``logits_all=False`` bug (see ``make_llama``)."""
    if getattr(llm, "draft_model", None) is not None and llm.scores.shape[0] < llm.n_ctx():
        raise ValueError(
            f"this Llama has a draft model but room for only {llm.scores.shape[0]} rows of logits "
            f"(n_ctx={llm.n_ctx()}): llama-cpp-python 0.3.36 then fails once the sequence passes "
            "n_batch tokens (ValueError: could not broadcast ... into shape (0,)). Create it with "
            "ngramcache.llama.make_llama (or logits_all=True), or decode with ngramcache.llama.generate, "
            "which needs no draft model")


def grow_score_rows(llm) -> bool:
    """Give ``llm`` a row of logits for every position of its context, as ``logits_all=True``
    does when it is created; True if it had fewer rows.

    llama-cpp-python 0.3.36 keeps the logits of every token once a ``Llama`` has a draft model,
    but sizes their buffer by ``logits_all``: created with ``logits_all=False`` (its default)
    and ``n_ctx > n_batch``, it has ``n_batch`` rows, and its first evaluation past them fails
    with "could not broadcast input array ... into shape (0,)". The new buffer is committed
    lazily, page by page, as llama-cpp-python's own is."""
    rows, n_vocab = llm.scores.shape
    n_ctx = llm.n_ctx()
    if rows >= n_ctx:
        return False
    grown = np.ndarray((n_ctx, n_vocab), dtype=llm.scores.dtype)
    n = min(int(llm.n_tokens), rows)
    grown[:n] = llm.scores[:n]
    llm.scores = grown
    return True


def _install_row_guard() -> None:
    """Have ``llama_cpp.Llama.eval`` give a ``Llama`` whose draft model is one of ngramcache's
    the logits rows it lacks (:func:`grow_score_rows`) before it evaluates anything, the first
    prompt included: llama-cpp-python calls no draft model before that prompt is evaluated, so
    nothing else can run in time. Installed once, by the first ngramcache draft model made; a
    ``Llama`` with another draft model, or none, evaluates exactly as before."""
    llama_class = llama_cpp.Llama
    if getattr(llama_class.eval, "_ngramcache_row_guard", False):
        return
    evaluate = llama_class.eval

    @functools.wraps(evaluate)
    def eval(self, tokens):
        if isinstance(getattr(self, "draft_model", None), (LlamaDrafter, CountingDraftModel)):
            grow_score_rows(self)
        return evaluate(self, tokens)

    eval._ngramcache_row_guard = True
    llama_class.eval = eval


class LlamaDrafter(Following, LlamaDraftModel):
    """Any ``Drafter`` as a llama-cpp-python draft model.

    llama-cpp-python passes the whole sequence (verified tokens plus the model's newest
    token) at every call; a :class:`~ngramcache.integrations.follower.SequenceFollower`
    gives the drafter only the new tokens when the sequence extends the previous call's
    (``accept``), and restarts it otherwise (a new request, a rewind: ``reset``, counted
    in ``resets``). A draft is at most ``n_max`` tokens (None: the drafter's ``n_draft``,
    8 for a drafter without one). ``drafted`` and ``accepted`` count the drafted tokens
    llama-cpp-python has verified and those it kept; ``stats`` are the drafter's own.

    Build the ``Llama`` with ``ngramcache.llama.make_llama(path, drafter)``: it is then exact
    and has room for the logits a draft model makes llama-cpp-python keep. A ``Llama(...,
    draft_model=LlamaDrafter(...))`` made by hand with ``logits_all=False`` (llama-cpp-python's
    default) would have room for only ``n_batch`` tokens' logits and fail once the sequence
    passes them (llama-cpp-python 0.3.36's bug, see :func:`grow_score_rows`). Making a
    ``LlamaDrafter`` therefore has ``Llama.eval`` give such a ``Llama`` the rows it lacks
    before it evaluates anything, the first prompt included; ``Llama`` objects without an
    ngramcache draft model are left as they are. Such a hand-made ``Llama`` is still not
    exact unless it was loaded without weight repacking (``make_llama`` does that).
    """

    def __init__(self, drafter: Drafter, n_max: int | None = None):
        if llama_cpp is not None:
            _install_row_guard()
        self._follower = SequenceFollower(drafter)
        self.n_max = check_int("n_max", n_max, 0, none_ok=True)

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        """The draft to follow ``input_ids`` (llama-cpp-python's call)."""
        self._follower.follow(input_ids)
        n = self.n_max if self.n_max is not None else getattr(self.drafter, "n_draft", 8)
        out = np.asarray(self.drafter.propose(n), dtype=np.intc)
        self._follower.handed_out(out)
        return out


class CountingDraftModel(LlamaDraftModel):
    """Wraps a llama-cpp-python draft model and records its proposals, so that drafted
    and accepted tokens can be counted once the output is known."""

    def __init__(self, inner: LlamaDraftModel):
        if llama_cpp is not None:
            _install_row_guard()
        self.inner = inner
        self.proposals: list[tuple[int, np.ndarray]] = []
        self.seconds = 0.0

    def __call__(self, input_ids, /, **kwargs):
        """The inner model's draft, recorded."""
        t = time.perf_counter()
        out = self.inner(input_ids, **kwargs)
        self.seconds += time.perf_counter() - t
        self.proposals.append((len(input_ids), np.asarray(out, dtype=np.int32).copy()))
        return out

    def count(self, sequence: np.ndarray) -> tuple[int, int]:
        """(drafted, accepted) given the final prompt + output sequence."""
        drafted = accepted = 0
        for n, p in self.proposals:
            truth = sequence[n : n + p.size]
            drafted += min(truth.size, p.size)  # proposals past the end of the output were never verified
            accepted += accepted_prefix(p, truth)
        return drafted, accepted


def generate_llama_cpp(llm, prompt, max_tokens: int = 128, stop_at_eos: bool = True) -> GenerationResult:
    """Greedy generation with llama-cpp-python's own loop (``Llama.generate``, with the
    ``draft_model`` the ``Llama`` was built with, if any), measured like ``generate``:
    ``t_prompt`` is the time to the first token. Wrap the draft model in
    ``CountingDraftModel`` to get drafted/accepted counts."""
    need_llama()
    max_tokens = check_int("max_tokens", max_tokens, 0)
    m = LlamaBackend.of(llm)
    check_llama(llm)
    prompt_tokens = m.tokenize(prompt)
    if prompt_tokens.size == 0:
        raise ValueError("prompt is empty")
    dm = llm.draft_model
    if isinstance(dm, CountingDraftModel):
        dm.proposals.clear()
        dm.seconds = 0.0
    out: list[int] = []
    stop_reason = "length"
    llm.reset()  # no reuse of a previous request's prompt
    t0 = time.perf_counter()
    t_prompt = 0.0
    if max_tokens > 0:
        for tok in llm.generate(prompt_tokens.tolist(), temp=0.0, repeat_penalty=1.0, reset=True):
            if not out:
                t_prompt = time.perf_counter() - t0
            out.append(int(tok))
            if stop_at_eos and m.is_eog(int(tok)):
                stop_reason = "eos"
                break
            if len(out) >= max_tokens:
                break
    t_total = time.perf_counter() - t0
    llm.reset()
    tokens = np.asarray(out, dtype=np.int32)
    drafted = accepted = 0
    t_draft = 0.0
    if isinstance(dm, CountingDraftModel):
        drafted, accepted = dm.count(np.concatenate([prompt_tokens, tokens]))
        t_draft = dm.seconds
    return GenerationResult.decoded(m, tokens, n_prompt=int(prompt_tokens.size), t_prompt=t_prompt,
                                    t_draft=t_draft, t_verify=t_total - t_prompt - t_draft, t_total=t_total,
                                    drafted=drafted, accepted=accepted, accept_lengths=[],
                                    stop_reason=stop_reason)
