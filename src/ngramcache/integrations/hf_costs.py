"""What a forward pass of k tokens costs a transformers model, learnt while decoding and kept
(``ngramcache.decoding.costs``), and the adaptive drafter built on it: the transformers
side is the model's size (for the prior curve), an explicit timing hook (a forward pass in a
``DynamicCache``, cropped back) and the key the costs are kept under (:func:`cost_key`)."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import time
from typing import Sequence

import numpy as np

from ngramcache._validate import check_int
from ngramcache.decoding import costs as _costs
from ngramcache.decoding.costs import CostKey
from ngramcache.decoding.gate import GateSettings, gated_drafter
from ngramcache.defaults import HF_N_DRAFT
from ngramcache.drafters.base import Drafter
from ngramcache.integrations.hf_extra import need_hf

__all__ = ["calibrate", "verify_costs", "learned_costs", "cost_key", "adaptive_drafter", "GATE_SETTINGS"]


def cost_key(model) -> CostKey:
    """The cost store's key for ``model``: its class and configuration (what a forward pass
    costs depends on the architecture, not on the weights' values), torch and transformers
    versions, dtype, device, attention implementation and torch's thread count."""
    need_hf()
    import torch
    import transformers

    cfg = {k: v for k, v in model.config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    digest = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]
    attn = getattr(model.config, "_attn_implementation", None)
    return CostKey(backend="transformers", model=f"{type(model).__name__} config {digest}",
                   build=f"torch {torch.__version__}|transformers {transformers.__version__}|{model.dtype}|"
                         f"{model.device}|attn {attn}",
                   threads=f"t{torch.get_num_threads()}")


@contextlib.contextmanager
def _forward_timer(model, max_batch: int, n_context: int):
    """The ``time_batch`` hook of ``ngramcache.decoding.costs.calibrate`` for a transformers
    model: a forward pass of k tokens after ``n_context`` tokens of context in a
    ``DynamicCache``, logits for the k positions and a token chosen from each, the cache
    cropped back afterwards."""
    import torch
    from transformers import DynamicCache

    vocab = int(model.config.get_text_config().vocab_size)
    ctx = torch.from_numpy(_costs.context_tokens(n_context + max_batch, vocab).astype(np.int64))
    ctx = ctx.unsqueeze(0).to(model.device)
    params = inspect.signature(model.forward).parameters
    cache_kw = "past_key_values" if "past_key_values" in params else "cache"
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=ctx[:, :n_context], use_cache=True, **{cache_kw: cache})

    @torch.no_grad()
    def time_batch(k: int) -> float:
        kw = {"logits_to_keep": k} if "logits_to_keep" in params else {}
        t = time.perf_counter()
        pos = torch.arange(n_context, n_context + k, device=model.device).unsqueeze(0)
        out = model(input_ids=ctx[:, n_context : n_context + k], position_ids=pos, use_cache=True,
                    **{cache_kw: cache}, **kw)
        out.logits[0, -k:].float().argmax(dim=-1).tolist()
        dt = time.perf_counter() - t
        cache.crop(-k)  # back to the context (a negative count removes tokens)
        return dt

    yield time_batch


def _measure(model, max_batch: int, n_context: int = 512, repeats: int = 5) -> _costs.Calibration:
    need_hf()
    max_batch = check_int("max_batch", max_batch, 1)
    n_context = check_int("n_context", n_context, 1)
    with _forward_timer(model, max_batch, n_context) as time_batch:
        return _costs.calibrate(time_batch, max_batch, repeats)


def calibrate(model, max_batch: int = 33, n_context: int = 512, repeats: int = 5) -> list[float]:
    """Seconds for a forward pass of k = 1..``max_batch`` tokens after ``n_context`` tokens
    of context (with logits for the k positions and the choice of a token from each, as
    verification does): ``ngramcache.decoding.costs.calibrate`` (every k up to 8 timed, then
    about four per doubling and the rest interpolated; interleaved rounds, medians, more
    rounds while noisy; the closest non-decreasing curve)."""
    return _measure(model, max_batch, n_context, repeats).costs


def learned_costs(model, max_batch: int = 33) -> _costs.LearnedCosts:
    """The verification cost curve of this model architecture, dtype, device and thread count
    (see :func:`cost_key`), at once: the one this process learns into, else the stored one
    (``ngramcache.decoding.costs.cost_store_path``), else the package's prior for a model of
    this size; refined while decoding and saved (``ngramcache.decoding.costs.learned_costs``)."""
    need_hf()
    n_params = sum(int(p.numel()) for p in model.parameters())
    return _costs.learned_costs(cost_key(model), max_batch, n_params)


def verify_costs(model, max_batch: int = 33, refresh: bool = False) -> list[float]:
    """The verification costs of batches of 1..``max_batch`` tokens as known now, relative to
    one token (:func:`learned_costs`; nothing is measured). ``refresh``: measure them now
    (``calibrate``, seconds) and keep the measurement as the stored curve."""
    costs = learned_costs(model, max_batch)
    if refresh:
        costs.replace(_measure(model, max_batch).costs)
    return list(costs.curve()[:max_batch])


#: the gate's settings for transformers on a CPU: verifying 33 tokens costs about 3x one, so a
#: wrong guess is cheap and a slow start is dear: the priors count as one observation, so what
#: this text does takes over after a draft or two (docs/gate.md)
GATE_SETTINGS = GateSettings(prior_weight=1.0)


def adaptive_drafter(model, drafter: str | None = None, n_draft: int = HF_N_DRAFT, costs: Sequence[float] | None = None,
                     **options) -> Drafter:
    """The drafter called ``drafter`` (``ngramcache.drafters.catalog``; None: its default) with an
    ``ngramcache.decoding.gate.Gate`` on this model's verification costs (``learned_costs``, or
    ``costs``: seconds per batch of 1, 2, ... tokens, extended linearly to ``n_draft + 1``) and
    ``GATE_SETTINGS``, proposing up to ``n_draft`` tokens: ``ngramcache.decoding.gate.gated_drafter``.
    ``options``: the drafter's own keywords."""
    from ngramcache.drafters.catalog import DEFAULT_DRAFTER, drafter_class

    n_draft = check_int("n_draft", n_draft, 0)
    drafter_class(DEFAULT_DRAFTER if drafter is None else drafter)  # an unknown name fails before measuring
    if costs is None:
        costs = learned_costs(model, max_batch=n_draft + 1)
    return gated_drafter(costs, drafter, n_draft, settings=GATE_SETTINGS, **options)
