"""Hugging Face transformers as the verifier (``pip install 'ngramcache[hf]'``).

* ``DrafterCandidateGenerator(drafter)``: any ngramcache ``Drafter`` as a transformers
  ``CandidateGenerator``, the object transformers' assisted generation asks for drafts.
* ``generate(model, input_ids, drafter=None, **generate_kwargs)``: ``model.generate`` with
  that generator, through transformers' own hook for a custom decoding loop
  (``generate(custom_generate=callable)``). transformers prepares the inputs, logits
  processors, stopping criteria and cache as for any ``generate`` call, then its own
  assisted-generation loop verifies the drafts: greedy output is plain greedy output,
  sampling keeps the model's distribution, EOS, ``max_new_tokens`` and stopping criteria
  behave as without drafts. Batch size 1, as transformers' assisted generation.
* ``load_model("smollm2")``: a packaged GGUF model (``ngramcache.models``) loaded by
  transformers itself (``from_pretrained(folder, gguf_file=name)``), dequantised to float32
  on the CPU; no model hub is contacted.
* ``verify_costs``: what a forward pass of k tokens costs this model against one, as learnt
  so far while decoding (``ngramcache.decoding.costs``, kept in its store on disk; ``calibrate``
  measures it explicitly), the curve a ``ngramcache.decoding.gate.Gate`` decides on;
  ``adaptive_drafter`` builds a drafter whose draft length follows it (these live in
  ``ngramcache.integrations.hf_costs``).

Supported transformers versions: 4.57 to 5.x (see docs/hf.md for the versions tested).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import time
from typing import Sequence

import numpy as np

import ngramcache.models as models
from ngramcache._validate import check_int
from ngramcache.drafters.base import Drafter
from ngramcache.integrations.follower import Following, SequenceFollower
from ngramcache.defaults import HF_N_DRAFT
from ngramcache.integrations.hf_costs import GATE_SETTINGS, adaptive_drafter, calibrate, cost_key, verify_costs
from ngramcache.integrations.hf_extra import MIN_TRANSFORMERS, need_hf, torch, transformers, version_tuple

if transformers is not None:
    from transformers.generation.candidate_generator import CandidateGenerator
else:  # the module imports without the extra; using it needs it (need_hf)
    class CandidateGenerator:  # type: ignore[no-redef]
        """Stand-in for transformers.generation.candidate_generator.CandidateGenerator."""

        requires_model_outputs = False


__all__ = ["DrafterCandidateGenerator", "Drafting", "generate", "load_model", "chat_input_ids", "calibrate",
           "verify_costs", "cost_key", "adaptive_drafter", "GATE_SETTINGS", "MIN_TRANSFORMERS"]

def _as_ids(input_ids, n_vocab: int | None = None) -> "torch.Tensor":
    """``input_ids`` as a (1, n) int64 tensor: a tensor, an array or a list of ints, every
    id in ``0 .. n_vocab - 1`` (the model's embedding would fail with a bare IndexError)."""
    if isinstance(input_ids, torch.Tensor):
        t = input_ids
    else:
        try:
            t = torch.as_tensor(np.asarray(input_ids))
        except (TypeError, ValueError) as e:
            raise TypeError(f"input_ids must be a tensor or a sequence of token ids ({e})") from None
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got {t.dtype}")
    if t.ndim == 1:
        t = t.unsqueeze(0)
    if t.ndim != 2:
        raise ValueError(f"input_ids must have shape (n,) or (1, n), got {tuple(t.shape)}")
    if t.shape[0] != 1:
        raise ValueError(f"ngramcache.integrations.hf.generate takes one sequence (batch size 1, as transformers' "
                         f"assisted generation), got a batch of {t.shape[0]}")
    if t.shape[1] == 0:
        raise ValueError("input_ids is empty: give at least one prompt token")
    # checked in NumPy: torch has no max() for uint64, and converting first would wrap ids >= 2**63
    row = t[0].detach().cpu().numpy()
    bad = np.flatnonzero(row < 0)
    if bad.size:
        raise ValueError(f"input_ids: negative token id {row[bad[0]]} at index {bad[0]}")
    if n_vocab is not None:
        bad = np.flatnonzero(row >= n_vocab)
        if bad.size:
            raise ValueError(f"input_ids: token id {row[bad[0]]} at index {bad[0]} is beyond the vocabulary "
                             f"({n_vocab} tokens)")
    return t.to(torch.long)


def _vocab_size(model) -> int:
    """The ids ``model`` can embed: its input embedding's rows, else its config's vocab_size."""
    emb = model.get_input_embeddings() if callable(getattr(model, "get_input_embeddings", None)) else None
    n = getattr(emb, "num_embeddings", None)
    return int(n) if n is not None else int(model.config.get_text_config().vocab_size)


class DrafterCandidateGenerator(Following, CandidateGenerator):
    """Any ``Drafter`` as a transformers ``CandidateGenerator``.

    transformers hands the generator the whole sequence at every step. A
    :class:`~ngramcache.integrations.follower.SequenceFollower` remembers what the drafter
    was shown: when the sequence extends it, only the new tokens go to the drafter
    (``accept``); otherwise (a new request, a rewind) the drafter restarts from the
    sequence (``reset``; counted in ``resets``). The verified tokens of a
    step reach the drafter as soon as transformers reports them
    (``update_candidate_strategy``), so even the last step of a generation is seen (a
    drafter that learns across requests, e.g. ``SuffixDrafter`` with a store, keeps it).

    A draft is at most ``n_max`` tokens (None: the drafter's ``n_draft``), never runs past
    ``max_length`` (the draft plus the model's own next token fit), and ends before the
    first EOS token it contains and before the first token after which one of
    ``stopping_criteria`` fires: that token is left to the model's own next token, so
    verification never accepts a token past the point where plain decoding stops.
    ``generate`` sets ``eos_token_id``, ``max_length`` and ``stopping_criteria`` from each
    call's generation config and stopping criteria.

    Counters since the last ``reset_counters``: ``steps`` (drafts asked for), ``resets``,
    ``drafted`` and ``accepted`` (drafted tokens handed to transformers, and those its
    verification kept, counted from the sequences it reports) and ``draft_seconds`` (the
    time spent in the generator: drafting and the bookkeeping around it).
    """

    requires_model_outputs = False

    def __init__(self, drafter: Drafter, n_max: int | None = None, eos_token_id=None,
                 max_length: int | None = None):
        self._follower = SequenceFollower(drafter)
        self.n_max = check_int("n_max", n_max, 0, none_ok=True)
        self.max_length = check_int("max_length", max_length, 1, none_ok=True)
        self.eos_token_id = eos_token_id
        #: criteria (besides EOS and max_length) a draft must not run past; ``generate``
        #: sets them from each call's stopping criteria
        self.stopping_criteria: list = []
        self.steps = 0  # get_candidates calls
        self.draft_seconds = 0.0
        # the batch handed to transformers to verify: (its tokens, when); its time goes to the
        # drafter's gate when transformers reports the verification
        self._verifying: tuple[int, float] | None = None

    @property
    def eos_token_id(self) -> frozenset:
        """Token ids a draft stops at (it keeps the first one it reaches)."""
        return self._eos

    @eos_token_id.setter
    def eos_token_id(self, value) -> None:
        if value is None:
            self._eos = frozenset()
            return
        if torch is not None and isinstance(value, torch.Tensor):
            value = value.reshape(-1).tolist()
        elif isinstance(value, (int, np.integer)):
            value = [int(value)]
        try:
            self._eos = frozenset(int(v) for v in value)
        except (TypeError, ValueError):
            raise TypeError(f"eos_token_id must be None, an int or a sequence of ints, got {value!r}") from None

    @property
    def num_drafting_tokens(self) -> int:
        """The most tokens one draft can hold: ``n_max``, else the drafter's ``n_draft``
        (``ngramcache.defaults.HF_N_DRAFT`` for a drafter without one). transformers reads
        it before the first step (a cache with recurrent layers keeps that many steps of
        state so a rejected draft can be rolled back)."""
        return self.n_max if self.n_max is not None else int(getattr(self.drafter, "n_draft", HF_N_DRAFT))

    def reset_counters(self) -> None:
        """Zero ``steps``, ``resets``, ``drafted``, ``accepted`` and ``draft_seconds``, and
        forget the sequence (the next call restarts the drafter)."""
        self.steps = 0
        self.draft_seconds = 0.0
        f = self._follower
        f.resets = f.drafted = f.accepted = 0
        f.forget()
        self._verifying = None

    def figures(self) -> "Drafting":
        """The counters now, as a :class:`Drafting`."""
        return Drafting(steps=self.steps, resets=self.resets, drafted=self.drafted, accepted=self.accepted,
                        draft_seconds=self.draft_seconds)

    @staticmethod
    def _row(input_ids) -> np.ndarray:
        if input_ids.ndim != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"DrafterCandidateGenerator drafts for one sequence, got input_ids of shape "
                             f"{tuple(input_ids.shape)}")
        return input_ids[0].detach().cpu().numpy().astype(np.int64, copy=False)

    def get_candidates(self, input_ids, **kwargs):
        """(``input_ids`` followed by the draft, None): transformers' call. No logits come
        with the draft: a drafter proposes tokens, and transformers then verifies them
        against the model's own choices (greedy) or samples (sampling)."""
        t0 = time.perf_counter()
        ids = self._follower.follow(self._row(input_ids))
        self.steps += 1
        n = self.num_drafting_tokens
        if self.max_length is not None:
            n = min(n, self.max_length - int(ids.size) - 1)
        out = input_ids
        draft = np.asarray(self.drafter.propose(n), dtype=np.int64)[:n] if n > 0 else np.zeros(0, dtype=np.int64)
        if self._eos:
            for i, tok in enumerate(draft.tolist()):
                if tok in self._eos:
                    draft = draft[:i]
                    break
        if draft.size:
            out = torch.cat((input_ids, torch.from_numpy(draft).to(input_ids.device).unsqueeze(0)), dim=1)
            if self.stopping_criteria:
                out = self._cut_at_stop(out, int(ids.size))
        self._follower.handed_out(draft[: out.shape[1] - ids.size])
        t1 = time.perf_counter()
        self.draft_seconds += t1 - t0
        self._verifying = (int(out.shape[1] - ids.size) + 1, t1)
        return out, None

    def _cut_at_stop(self, seq, n0: int):
        # the draft ends before the first token after which a stopping criterion fires:
        # that token is left to the model (its own next token), and the check after the
        # step stops generation where plain decoding does
        for end in range(n0 + 1, seq.shape[1] + 1):
            if any(bool(c(seq[:, :end], None).any()) for c in self.stopping_criteria):
                return seq[:, : end - 1]
        return seq

    def update_candidate_strategy(self, input_ids, scores, num_matches) -> None:
        """transformers' report after verification: the drafter is given the verified
        tokens at once."""
        t0 = time.perf_counter()
        if self._verifying is not None:
            n_tokens, since = self._verifying
            self._verifying = None
            verified = getattr(self.drafter, "verified", None)
            if verified is not None:
                verified(n_tokens, t0 - since)
        self._follower.follow(self._row(input_ids))
        self.draft_seconds += time.perf_counter() - t0

    def __repr__(self) -> str:
        return f"<DrafterCandidateGenerator {self.drafter!r}, {self.steps} steps, {self.resets} resets>"


@dataclasses.dataclass(frozen=True)
class Drafting:
    """The drafting figures of one ``generate`` call (``out.drafting`` with
    ``return_dict_in_generate=True``): drafting ``steps``, ``resets`` of the drafter,
    tokens ``drafted`` and of those ``accepted``, and ``draft_seconds`` spent drafting."""

    steps: int
    resets: int
    drafted: int
    accepted: int
    draft_seconds: float

    @property
    def acceptance(self) -> float:
        """Accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def __sub__(self, before: "Drafting") -> "Drafting":
        return Drafting(*(getattr(self, f.name) - getattr(before, f.name) for f in dataclasses.fields(self)))


# ---------------------------------------------------------------------------------
# generate


_SENTINEL = object()


def _run_assisted(model, generator: DrafterCandidateGenerator, input_ids, logits_processor, stopping_criteria,
                  generation_config, **kwargs):
    """transformers' own assisted decoding, with ``generator`` as its candidate generator."""
    if getattr(generation_config, "num_beams", 1) not in (None, 1):
        raise ValueError(f"ngramcache.integrations.hf.generate does not do beam search (num_beams={generation_config.num_beams}); "
                         "transformers' assisted generation needs num_beams=1")
    generator.eos_token_id = getattr(generation_config, "_eos_token_tensor", None)
    generator.max_length = generation_config.max_length
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    # EOS and max_length are the generator's own cheap checks; any other criterion is
    # evaluated on the draft
    generator.stopping_criteria = [c for c in stopping_criteria
                                   if not isinstance(c, (EosTokenCriteria, MaxLengthCriteria))]
    from transformers.generation.utils import GenerationMixin

    assisted = GenerationMixin._assisted_decoding
    params = inspect.signature(assisted).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in params or k not in _DECODING_ONLY}
    # the loop asks the model for its candidate generator: this call's is ours
    own = model.__dict__.get("_get_candidate_generator", _SENTINEL)
    model._get_candidate_generator = lambda *a, **k: generator
    try:
        return assisted(model, input_ids, logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                        generation_config=generation_config, **kwargs)
    finally:
        if own is _SENTINEL:
            del model._get_candidate_generator
        else:
            model._get_candidate_generator = own


# arguments of a decoding method that are not model inputs (dropped when the installed
# transformers' assisted decoding does not take them)
_DECODING_ONLY = {"synced_gpus", "streamer", "inputs_tensor", "assistant_model", "assistant_tokenizer", "tokenizer"}


def generate(model, input_ids, drafter=None, **generate_kwargs):
    """``model.generate(input_ids, **generate_kwargs)`` with drafts from ``drafter``,
    verified by transformers' own assisted-generation loop.

    ``drafter``: any ``Drafter``, a ``DrafterCandidateGenerator`` (to keep its counters
    across calls), a name of ``ngramcache.drafters.catalog.DRAFTERS`` (built by
    ``adaptive_drafter``), or None for ``adaptive_drafter(model)``: ngramcache's default
    drafter with the draft length this model's verification costs call for.
    ``generate_kwargs``: anything ``model.generate`` takes (``max_new_tokens``,
    ``do_sample``, ``logits_processor``, ``stopping_criteria``, ``streamer``,
    ``return_dict_in_generate``, ...), except ``custom_generate``, ``assistant_model``,
    ``prompt_lookup_num_tokens`` and beam search, which would replace the drafts.
    Returns what ``model.generate`` returns; with ``return_dict_in_generate=True`` its
    output also carries ``drafting``, this call's :class:`Drafting` figures (drafted,
    accepted, acceptance, steps, resets, draft_seconds).
    """
    need_hf()
    if not isinstance(model, transformers.PreTrainedModel) or not hasattr(model, "generate"):
        raise TypeError(f"model must be a transformers model with generate(), got {type(model).__name__}")
    for k in ("custom_generate", "assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit"):
        if generate_kwargs.get(k) is not None:
            raise ValueError(f"ngramcache.integrations.hf.generate supplies the drafts itself: {k} cannot be given")
    ids = _as_ids(input_ids, _vocab_size(model))
    if isinstance(drafter, DrafterCandidateGenerator):
        generator = drafter
    else:
        if drafter is None or isinstance(drafter, str):
            drafter = adaptive_drafter(model, drafter)
        generator = DrafterCandidateGenerator(drafter)
    streamer = generate_kwargs.get("streamer")

    def decode(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
               **model_kwargs):
        # some transformers releases give a custom loop neither the streamer nor synced_gpus
        model_kwargs.setdefault("streamer", streamer)
        return _run_assisted(model, generator, input_ids, logits_processor, stopping_criteria, generation_config,
                             synced_gpus=synced_gpus, **model_kwargs)

    before = generator.figures()
    out = model.generate(ids.to(model.device), custom_generate=decode, **generate_kwargs)
    if isinstance(out, transformers.utils.ModelOutput):
        out.drafting = generator.figures() - before
    return out


# ---------------------------------------------------------------------------------
# packaged models


def _need_gguf() -> None:
    need_hf()
    missing = []
    for mod in ("gguf", "accelerate"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise ImportError(f"loading a GGUF file into transformers needs {' and '.join(missing)}: "
                          "pip install 'ngramcache[hf]'")


def load_model(model: str | os.PathLike = "smollm2", dtype=None, tokenizer: bool = True):
    """(model, tokenizer) from a GGUF file or a packaged model's name (``"smollm2"``,
    ``"gemma"``; see ``ngramcache.models``), loaded by transformers' own GGUF support
    (``from_pretrained(folder, gguf_file=name)``) and dequantised on the CPU to ``dtype``
    (default float32). Nothing is fetched and nothing is written outside the user's cache
    folder (only the Gemma package assembles its file there). ``tokenizer=False``: the
    model alone, (model, None). About 25-40 s for SmolLM2 on a small CPU."""
    _need_gguf()
    path = models.model_path(model)
    folder, name = os.path.split(os.path.abspath(path))
    dtype = torch.float32 if dtype is None else dtype
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"dtype": dtype} if version_tuple(transformers.__version__) >= (4, 56) else {"torch_dtype": dtype}
    try:
        m = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True, **kw)
    except ValueError as e:
        raise ValueError(f"{path}: transformers {transformers.__version__} cannot load this GGUF file ({e})") from e
    m.eval()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True) if tokenizer else None
    return m, tok


def chat_input_ids(tokenizer, text: str | Sequence[dict]) -> "torch.Tensor":
    """The (1, n) prompt for ``text`` (a user message, or a list of chat messages) in the
    tokenizer's chat template, ready for the assistant's answer. A tokenizer without a chat
    template (a base model's, e.g. Gemma 3 270M) encodes the string as it is, with the
    tokenizer's special tokens (BOS)."""
    need_hf()
    if getattr(tokenizer, "chat_template", None) is None:
        if not isinstance(text, str):
            raise ValueError("this tokenizer has no chat template: give the prompt as one string")
        return tokenizer(text, return_tensors="pt")["input_ids"]
    msgs = [{"role": "user", "content": text}] if isinstance(text, str) else list(text)
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(out, torch.Tensor):  # newer releases return a BatchEncoding
        out = out["input_ids"]
    return out
