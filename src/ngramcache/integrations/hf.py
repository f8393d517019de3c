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
* ``calibrate`` / ``verify_costs``: what a forward pass of k tokens costs this model after a
  context, the curve ``ngramcache.decoding.gate.AdaptiveGate`` needs; ``adaptive_drafter`` builds a
  drafter whose draft length follows it.

Supported transformers versions: 4.57 to 5.x (see docs/hf.md for the versions tested).
"""

from __future__ import annotations

import inspect
import os
import re
import time
from typing import Sequence

import numpy as np

import ngramcache.models as models
from ngramcache._validate import check_int
from ngramcache.drafters.base import Drafter, DraftStats
from ngramcache.decoding.gate import AdaptiveGate

try:
    import torch
    import transformers
    from transformers.generation.candidate_generator import CandidateGenerator
    _IMPORT_ERROR = None
except ImportError as e:  # the module imports without the extra; using it needs it
    torch = transformers = None
    _IMPORT_ERROR = e

    class CandidateGenerator:  # type: ignore[no-redef]
        """Stand-in for transformers.generation.candidate_generator.CandidateGenerator."""

        requires_model_outputs = False


__all__ = ["DrafterCandidateGenerator", "generate", "load_model", "chat_input_ids", "calibrate",
           "verify_costs", "adaptive_drafter", "GATE_OPTIONS", "MIN_TRANSFORMERS"]

#: the oldest transformers release this module supports (the first whose assisted
#: generation builds its candidate generator inside the decoding loop)
MIN_TRANSFORMERS = (4, 57)


def _version_tuple(v: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string such as 4.57.0 or 5.0.0rc1."""
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def _need_hf() -> None:
    if _IMPORT_ERROR is not None:
        raise ImportError(f"ngramcache.integrations.hf needs transformers and torch ({_IMPORT_ERROR}); "
                          "install them with pip install 'ngramcache[hf]'") from None
    if _version_tuple(transformers.__version__) < MIN_TRANSFORMERS:
        raise ImportError(f"ngramcache.integrations.hf needs transformers >= {'.'.join(map(str, MIN_TRANSFORMERS))}, "
                          f"found {transformers.__version__}: pip install 'ngramcache[hf]'")


def _as_ids(input_ids) -> "torch.Tensor":
    """``input_ids`` as a (1, n) int64 tensor: a tensor, an array or a list of ints."""
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
    return t.to(torch.long)


class DrafterCandidateGenerator(CandidateGenerator):
    """Any ``Drafter`` as a transformers ``CandidateGenerator``.

    transformers hands the generator the whole sequence at every step. The generator
    remembers what it showed the drafter: when the sequence extends it, only the new
    tokens go to the drafter (``accept``); otherwise (a new request, a rewind) the drafter
    restarts from the sequence (``reset``; counted in ``resets``). The verified tokens of a
    step reach the drafter as soon as transformers reports them
    (``update_candidate_strategy``), so even the last step of a generation is seen (a
    drafter that learns across requests, e.g. ``SuffixDrafter`` with a store, keeps it).

    A draft is at most ``n_max`` tokens (None: the drafter's ``n_draft``), never runs past
    ``max_length`` (the draft plus the model's own next token fit), and ends before the
    first EOS token it contains and before the first token after which one of
    ``stopping_criteria`` fires: that token is left to the model's own next token, so
    verification never accepts a token past the point where plain decoding stops. ``generate`` sets ``eos_token_id``, ``max_length`` and ``stopping_criteria``
    from each call's generation config and stopping criteria. ``draft_seconds`` is the time spent in the generator
    (drafting and the bookkeeping around it) since the last ``reset``.
    """

    requires_model_outputs = False

    def __init__(self, drafter: Drafter, n_max: int | None = None, eos_token_id=None,
                 max_length: int | None = None):
        if not isinstance(drafter, Drafter):
            raise TypeError(f"drafter must implement the Drafter protocol, got {type(drafter).__name__}")
        self.drafter = drafter
        self.n_max = check_int("n_max", n_max, 0, none_ok=True)
        self.max_length = check_int("max_length", max_length, 1, none_ok=True)
        self.eos_token_id = eos_token_id
        #: criteria (besides EOS and max_length) a draft must not run past; ``generate``
        #: sets them from each call's stopping criteria
        self.stopping_criteria: list = []
        self.resets = 0  # times the sequence was not an extension of what the drafter had
        self.steps = 0  # get_candidates calls
        self.draft_seconds = 0.0
        self._seq = np.empty(0, dtype=np.int64)
        self._n = 0

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
    def stats(self) -> DraftStats:
        """The wrapped drafter's counters."""
        return self.drafter.stats

    @property
    def num_drafting_tokens(self) -> int:
        """The most tokens one draft can hold: ``n_max``, else the drafter's ``n_draft``
        (8 for a drafter without one). transformers reads it before the first step (a cache
        with recurrent layers keeps that many steps of state so a rejected draft can be
        rolled back)."""
        return self.n_max if self.n_max is not None else int(getattr(self.drafter, "n_draft", 8))

    def reset_counters(self) -> None:
        """Zero ``resets``, ``steps`` and ``draft_seconds``, and forget the sequence (the
        next call restarts the drafter)."""
        self.resets = self.steps = 0
        self.draft_seconds = 0.0
        self._n = 0

    def _sync(self, ids: np.ndarray) -> None:
        n = self._n
        if n and ids.size >= n and np.array_equal(ids[:n], self._seq[:n]):
            if ids.size > n:
                self.drafter.accept(ids[n:].astype(np.int32))
        else:
            if n:
                self.resets += 1
            self.drafter.reset(ids.astype(np.int32))
        if ids.size > self._seq.size:
            grown = np.empty(max(ids.size, 2 * self._seq.size, 1024), dtype=np.int64)
            grown[:n] = self._seq[:n]
            self._seq = grown
        self._seq[n : ids.size] = ids[n:]
        self._n = int(ids.size)

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
        ids = self._row(input_ids)
        self._sync(ids)
        self.steps += 1
        n = self.num_drafting_tokens
        if self.max_length is not None:
            n = min(n, self.max_length - int(ids.size) - 1)
        out = input_ids
        if n > 0:
            draft = np.asarray(self.drafter.propose(n), dtype=np.int64)[:n]
            if draft.size:
                if self._eos:
                    for i, tok in enumerate(draft.tolist()):
                        if tok in self._eos:
                            draft = draft[:i]
                            break
                out = torch.cat((input_ids, torch.from_numpy(draft).to(input_ids.device).unsqueeze(0)), dim=1)
                if self.stopping_criteria:
                    out = self._cut_at_stop(out, int(ids.size))
        self.draft_seconds += time.perf_counter() - t0
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
        self._sync(self._row(input_ids))
        self.draft_seconds += time.perf_counter() - t0

    def __repr__(self) -> str:
        return f"<DrafterCandidateGenerator {self.drafter!r}, {self.steps} steps, {self.resets} resets>"


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
    Returns what ``model.generate`` returns.
    """
    _need_hf()
    if not isinstance(model, transformers.PreTrainedModel) or not hasattr(model, "generate"):
        raise TypeError(f"model must be a transformers model with generate(), got {type(model).__name__}")
    for k in ("custom_generate", "assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit"):
        if generate_kwargs.get(k) is not None:
            raise ValueError(f"ngramcache.integrations.hf.generate supplies the drafts itself: {k} cannot be given")
    ids = _as_ids(input_ids)
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

    return model.generate(ids.to(model.device), custom_generate=decode, **generate_kwargs)


# ---------------------------------------------------------------------------------
# packaged models


def _need_gguf() -> None:
    _need_hf()
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

    kw = {"dtype": dtype} if _version_tuple(transformers.__version__) >= (4, 56) else {"torch_dtype": dtype}
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
    _need_hf()
    if getattr(tokenizer, "chat_template", None) is None:
        if not isinstance(text, str):
            raise ValueError("this tokenizer has no chat template: give the prompt as one string")
        return tokenizer(text, return_tensors="pt")["input_ids"]
    msgs = [{"role": "user", "content": text}] if isinstance(text, str) else list(text)
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(out, torch.Tensor):  # newer releases return a BatchEncoding
        out = out["input_ids"]
    return out


# ---------------------------------------------------------------------------------
# verification costs and the adaptive drafter


def _grid(max_batch: int) -> list[int]:
    """The batch sizes ``calibrate`` times: every size up to 8, then about four per doubling,
    and ``max_batch`` itself."""
    ks, k = [], 1
    while k < max_batch:
        ks.append(k)
        k += 1 if k < 8 else max(1, k // 4)
    return ks + [max_batch]


def calibrate(model, max_batch: int = 33, n_context: int = 256, repeats: int = 3) -> list[float]:
    """Seconds for a forward pass of k = 1..``max_batch`` tokens after ``n_context`` tokens
    of context (with logits for the k positions and the choice of a token from each, as
    verification does). Every k up to 8 is timed, then about four per doubling (the curve
    is smooth there; the rest is interpolated). Batch sizes are interleaved, each keeps the
    fastest of ``repeats`` rounds (load from other processes only ever adds time), and the
    curve is the closest non-decreasing one (a longer batch never costs less)."""
    _need_hf()
    max_batch = check_int("max_batch", max_batch, 1)
    n_context = check_int("n_context", n_context, 1)
    repeats = check_int("repeats", repeats, 1)
    from transformers import DynamicCache

    vocab = int(model.config.get_text_config().vocab_size)
    lo = 100 if vocab > 1000 else 0  # clear of a real vocabulary's special tokens
    ctx = torch.arange(n_context + max_batch, dtype=torch.long) * 7919 % min(vocab - lo, 30000) + lo
    ctx = ctx.unsqueeze(0).to(model.device)
    kw = {}
    params = inspect.signature(model.forward).parameters
    cache_kw = "past_key_values" if "past_key_values" in params else "cache"
    grid = _grid(max_batch)
    best = {k: float("inf") for k in grid}
    with torch.no_grad():
        cache = DynamicCache()
        model(input_ids=ctx[:, :n_context], use_cache=True, **{cache_kw: cache})
        for r in range(repeats + 1):  # round 0 warms up
            for k in grid:
                t = time.perf_counter()
                pos = torch.arange(n_context, n_context + k, device=model.device).unsqueeze(0)
                if "logits_to_keep" in params:
                    kw["logits_to_keep"] = k
                out = model(input_ids=ctx[:, n_context : n_context + k], position_ids=pos, use_cache=True,
                            **{cache_kw: cache}, **kw)
                out.logits[0, -k:].float().argmax(dim=-1).tolist()
                dt = time.perf_counter() - t
                cache.crop(-k)  # back to the context (a negative count removes tokens)
                if r:
                    best[k] = min(best[k], dt)
    curve = np.interp(np.arange(1, max_batch + 1), grid, _non_decreasing([best[k] for k in grid]))
    return [float(x) for x in curve]


def _non_decreasing(y: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``y`` in least squares (pool adjacent
    violators): one slow timing flattens its neighbourhood instead of lifting every
    longer batch."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in y:
        blocks.append([float(v), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks[-1]
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return [m for m, n in blocks for _ in range(int(n))]


def verify_costs(model, max_batch: int = 33, refresh: bool = False) -> list[float]:
    """``calibrate(model, max_batch)``, measured once per model object (kept on it)."""
    max_batch = check_int("max_batch", max_batch, 1)
    have = getattr(model, "_ngramcache_costs", None)
    if not refresh and have is not None and len(have) >= max_batch:
        return list(have[:max_batch])
    costs = calibrate(model, max_batch)
    try:
        model._ngramcache_costs = costs
    except AttributeError:
        pass
    return costs


#: the gate's settings for transformers on a CPU: verifying 33 tokens costs about 3x one, so a
#: wrong guess is cheap and a slow start is dear (a uniform prior, little pooling, positions
#: not reached yet take the furthest reached one's estimate); measured with bench/bench_hf.py
GATE_OPTIONS = {"prior": (1.0, 1.0), "shrink": 1.0, "carry_forward": True}


def adaptive_drafter(model, drafter: str | None = None, n_draft: int = 32, costs: Sequence[float] | None = None,
                     **options) -> Drafter:
    """The drafter called ``drafter`` (``ngramcache.drafters.catalog``; None: its default) with an
    ``AdaptiveGate`` on this model's verification costs (``verify_costs``, or ``costs``:
    seconds per batch of 1..n_draft+1 tokens) and ``GATE_OPTIONS``, proposing up to
    ``n_draft`` tokens.
    ``options``: the drafter's own keywords."""
    from ngramcache.drafters.catalog import DEFAULT_DRAFTER, make_drafter

    n_draft = check_int("n_draft", n_draft, 0)
    name = DEFAULT_DRAFTER if drafter is None else drafter
    if costs is None:
        costs = verify_costs(model, max_batch=n_draft + 1) if n_draft > 0 else [1.0]
    return make_drafter(name, n_draft=n_draft, gate=AdaptiveGate(costs, **GATE_OPTIONS), **options)
