"""Offline replay of a token stream: how well would lookup drafting have done?

``replay`` is llama.cpp's ``llama-lookup-stats`` loop (docs/llama-lookup.md §5.1), run in C++ without the
GIL, plus the figures that tool does not give: where accepted drafts come from (cache and
n-gram size), how acceptance falls along the draft, how much of the text was already
known (overlap), cache load time and peak memory. See docs/cli.md for every figure.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Callable

import numpy as np

from ngramcache import _core
from ngramcache._validate import as_tokens, check_int
from ngramcache.cache import CacheFormatError, NgramCache
from ngramcache.defaults import MAX_REPLAY_DRAFT
from ngramcache.files import open_cache
from ngramcache.progress import peak_rss_bytes
from ngramcache.replay_stats import SOURCES, GateFigures, ReplayStats
from ngramcache.static_table import StaticTable

__all__ = ["replay", "replay_drafter"]

def _open(path, role: str):
    """The cache file at ``path`` and the seconds it took to open it (llama-lookup-stats
    counts them as t_draft_flat); a dynamic cache comes back mutable, since the chunks
    are merged into it. A failure keeps its type, and its message says which cache, in
    llama.cpp's words, then why."""
    path = os.fspath(path)
    t0 = time.perf_counter()
    try:
        cache = open_cache(path)
    except (OSError, CacheFormatError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        if reason.startswith(path + ": "):  # the core names the file first
            reason = reason[len(path) + 2:]
        err = type(e)(f"failed to open {role} lookup cache: {path}: {reason}")
        if isinstance(e, OSError):
            err.errno = e.errno  # without strerror, so that str(err) is the message alone
        raise err from e
    if role == "dynamic" and isinstance(cache, StaticTable):
        cache = cache.to_cache()
    return cache, time.perf_counter() - t0


def _stats_from(r: _core.ReplayResult, **fields) -> ReplayStats:
    """ReplayStats from what the core counted: every field of the same name, times from
    nanoseconds to seconds, per-source and per-size lists as dicts; ``fields`` adds the
    figures measured here."""
    for f in dataclasses.fields(ReplayStats):
        if f.name in fields:
            continue
        if hasattr(r, f.name):
            fields[f.name] = getattr(r, f.name)
        elif hasattr(r, f.name + "_ns"):
            fields[f.name] = getattr(r, f.name + "_ns") * 1e-9
    for name in ("drafted_by_source", "accepted_by_source"):
        fields[name] = dict(zip(SOURCES, fields[name]))
    for name in ("drafted_by_ngram", "accepted_by_ngram"):
        fields[name] = {k + 1: v for k, v in enumerate(fields[name])}
    return ReplayStats(**fields)


def _oob_reads(values, n_chunks: int) -> np.ndarray:
    """``llama_oob`` given as what llama.cpp read before each chunk: (n_chunks, 4) int32."""
    try:
        a = np.asarray(values)
    except (TypeError, ValueError) as e:
        raise TypeError(f"llama_oob must be True, False or an integer array of shape (chunks, 4) ({e})") from None
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"llama_oob must be True, False or an integer array of shape (chunks, 4), got dtype {a.dtype}")
    if a.shape != (n_chunks, 4):
        raise ValueError(f"llama_oob: expected one row of 4 reads per chunk, shape ({n_chunks}, 4), got {a.shape}")
    if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
        raise ValueError("llama_oob: the reads are 32-bit tokens, a value is out of the int32 range")
    return np.ascontiguousarray(a, dtype=np.int32)


def _check_replay(tokens, n_ctx, n_draft, progress, too_short: str) -> tuple[np.ndarray, int, int]:
    """(tokens, n_ctx, n_draft) of a replay, checked; ``too_short`` says why a text of at
    most ``n_ctx`` tokens cannot be replayed, ``{}`` standing for the tokens it needs."""
    n_ctx = check_int("n_ctx", n_ctx, 2)
    n_draft = check_int("n_draft", n_draft, 0)
    check_int("n_draft", n_draft, hi=MAX_REPLAY_DRAFT)
    arr = as_tokens(tokens)
    if arr.size <= n_ctx:
        raise ValueError(f"tokens: {arr.size} tokens is too short to replay with n_ctx = {n_ctx}: "
                         + too_short.format(n_ctx + 1))
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be callable or None, got {type(progress).__name__}")
    return arr, n_ctx, n_draft


def replay(tokens, n_ctx: int, n_draft: int, static=None, dynamic=None, update_dynamic: bool = False,
           progress: Callable[[int, int], object] | None = None, llama_oob=True) -> ReplayStats:
    """Replay ``tokens`` as llama-lookup-stats does and return the statistics.

    ``tokens`` are cut into chunks of ``n_ctx``; each chunk is replayed from an empty
    context cache, drafting up to ``n_draft`` tokens per step and accepting those that
    match the text; chunks are then merged into the dynamic cache. The last chunk is
    skipped unless at least one token follows it, so ``tokens`` needs more than ``n_ctx``
    tokens (ValueError otherwise).

    ``static``: None, an NgramCache, a StaticTable, or a path (a static table file or a
    llama.cpp lookup.bin; loading time is measured). ``dynamic``: None (start empty, as
    llama.cpp does without ``-lcd``), an NgramCache or a lookup.bin path. The dynamic
    cache given is left unchanged (a copy absorbs the chunks) unless ``update_dynamic``.
    A path that cannot be opened raises what opening it raised (FileNotFoundError,
    another OSError or CacheFormatError), its message starting "failed to open static
    lookup cache: PATH" (or dynamic), as llama.cpp words it.
    ``progress(done, total)`` is called from the replay at most every 100,000 tokens and at
    the end; an exception it raises (or Ctrl-C) stops the replay and propagates.
    ``llama_oob``: at a chunk's second and third token, llama.cpp's 3- and 4-gram keys
    reach before the chunk's start and read its heap there (docs/parity.md); True reads
    what that read usually gives on glibc (33 right before a 2-token start, 0 before that
    and before a 3-token start), False treats those keys as not found. An integer array of
    shape (chunks, 4) gives what one run of llama.cpp read before each chunk instead (as
    recorded by an instrumented build, docs/parity.md): the tokens before a 2-token start
    (S[-2], S[-1]), S[-1] there after one drafted token, and S[-1] before a 3-token start.
    """
    arr, n_ctx, n_draft = _check_replay(tokens, n_ctx, n_draft, progress,
                                        "llama-lookup-stats replays only whole chunks followed by at least one more "
                                        "token, so it needs at least {} (use a longer text or a smaller n_ctx)")
    if isinstance(dynamic, (str, os.PathLike)) and update_dynamic:
        raise ValueError("update_dynamic=True needs an NgramCache object (a cache loaded from a path "
                         "would be updated and thrown away)")
    if not isinstance(static, (str, os.PathLike, NgramCache, StaticTable)) and static is not None:
        raise TypeError(f"static must be None, a path, an NgramCache or a StaticTable, got {type(static).__name__}")
    if not isinstance(dynamic, (str, os.PathLike, NgramCache)) and dynamic is not None:
        raise TypeError(f"dynamic must be None, a path or an NgramCache, got {type(dynamic).__name__}")
    if update_dynamic and dynamic is None:
        raise ValueError("update_dynamic=True needs a dynamic cache")
    oob_reads = None
    if not isinstance(llama_oob, (bool, np.bool_)):
        oob_reads = _oob_reads(llama_oob, (arr.size - 1) // n_ctx)
        llama_oob = True

    static_load_s = dynamic_load_s = None
    if isinstance(static, (str, os.PathLike)):
        static, static_load_s = _open(static, "static")
    if isinstance(dynamic, (str, os.PathLike)):
        dynamic, dynamic_load_s = _open(dynamic, "dynamic")
    if isinstance(static, StaticTable):
        static_kind = "static table"
    elif isinstance(static, NgramCache):
        static_kind = "NgramCache" if static_load_s is None else "lookup.bin"
    else:
        static_kind = "none"

    r = _core.replay(arr, n_ctx, n_draft, None if static is None else static._impl,
                     None if dynamic is None else dynamic._impl, bool(update_dynamic), progress, bool(llama_oob),
                     oob_reads)
    n_input = int(arr.size)
    return _stats_from(r, n_draft=n_draft, n_ctx=n_ctx, n_input=n_input, n_predict=n_input - n_input % n_ctx,
                       t_draft_flat=(static_load_s or 0.0) + (dynamic_load_s or 0.0), static_kind=static_kind,
                       static_load_s=static_load_s, dynamic_load_s=dynamic_load_s, peak_rss_bytes=peak_rss_bytes())


def replay_drafter(tokens, drafter, n_ctx: int, n_draft: int,
                   progress: Callable[[int, int], object] | None = None, *, gate=None, costs=None,
                   n_prompt: int = 1) -> ReplayStats:
    """Replay ``tokens`` with any drafter: the loop of ``replay`` (chunks of ``n_ctx``,
    each a new request: the drafter is reset with the chunk's first token), proposing up
    to ``n_draft`` tokens per step, accepting the longest prefix that matches the text
    plus the next text token, handed to the drafter in one ``accept`` as a speculative
    loop does. What the drafter keeps across requests (a ``SuffixStore``, an
    ``NgramModTable``) carries from chunk to chunk.

    ``drafter``: any ``Drafter``. One with a compiled core (a ``CoreSequenceDrafter``)
    is replayed entirely in C++; any other through its Python methods, with the same
    counts. ``lookup`` replayed here is the drafter; ``replay`` measures llama.cpp's
    lookup exactly as llama-lookup-stats. The drafter's gate and its own ``n_draft`` are
    not consulted (the replay measures up to ``n_draft`` proposed tokens themselves). Its
    state is replaced by the replay's last chunk. The per-source, per-n-gram and overlap
    figures are lookup's own and stay empty; ``drafter`` in the result is its registered
    name (``ngramcache.drafters.registry``), else its class name.

    ``gate``: None, or a ``GateSettings`` (a new gate on ``costs``) or a ``Gate`` (one that
    has learnt already, on its own curve; it goes on learning): at every step the gate
    decides how many of the proposal's tokens are verified, as a ``GatedDrafter`` does
    while decoding, and learns from every proposal scored against the text. The counts are
    then of the verified tokens, and ``gate`` in the result holds the modelled speed-up
    (:class:`GateFigures`). ``costs``: cost(1), cost(2), ... of verifying 1, 2, ... tokens
    (only ratios matter), extended to ``n_draft + 1``; None: the package's prior curve for
    llama.cpp (``ngramcache.decoding.priors.cost_prior``). ``n_prompt`` (gated replays
    only): the tokens each chunk starts from, its prompt: the drafter is reset with them
    and the steps replay the rest (a recorded prompt and its output, one chunk). Only a
    drafter with a compiled core can be replayed with a gate (in C++, with the gate's own
    core, without the GIL: no other thread may use that gate meanwhile).
    """
    from ngramcache.decoding.gate import GatedDrafter
    from ngramcache.drafters.base import CoreSequenceDrafter, Drafter

    if isinstance(drafter, GatedDrafter):  # the replay measures the proposals themselves
        drafter = drafter.drafter
    arr, n_ctx, n_draft = _check_replay(tokens, n_ctx, n_draft, progress, "the replay needs at least {}")
    if not isinstance(drafter, Drafter):
        raise TypeError(f"replay_drafter needs a Drafter (reset, propose, accept, stats), got {type(drafter).__name__}")
    if gate is not None or costs is not None:
        return _replay_gated(arr, drafter, n_ctx, n_draft, progress, gate, costs, n_prompt)
    if n_prompt != 1:
        raise ValueError("n_prompt applies to a gated replay: give gate too (a GateSettings or a Gate)")
    if isinstance(drafter, CoreSequenceDrafter):
        core = drafter._impl
        drafter.reset([])  # the drafter's own buffer would no longer describe its core after the replay
        r = _core.replay_drafter(core, arr, n_ctx, n_draft, progress)
        fields = {f: getattr(r, f) for f in _DRAFTER_FIELDS}
        t_draft, t_replay = r.t_draft_ns * 1e-9, r.t_replay_ns * 1e-9
    else:
        fields, t_draft, t_replay = _replay_in_python(drafter, arr, n_ctx, n_draft, progress)
    n_input = int(arr.size)
    return ReplayStats(n_draft=n_draft, n_ctx=n_ctx, n_input=n_input, n_predict=n_input - n_input % n_ctx,
                       t_draft_flat=0.0, t_draft=t_draft, t_replay=t_replay, drafter=_drafter_name(drafter),
                       peak_rss_bytes=peak_rss_bytes(), **fields)


def _replay_gated(arr: np.ndarray, drafter, n_ctx: int, n_draft: int, progress, gate, costs,
                  n_prompt: int) -> ReplayStats:
    """replay_drafter with a gate (its docstring): the compiled replay with the gate's core."""
    from ngramcache.decoding.costs import check_costs, extend_costs
    from ngramcache.decoding.gate import Gate, GateSettings
    from ngramcache.decoding.priors import cost_prior
    from ngramcache.drafters.base import CoreSequenceDrafter

    if gate is None:
        raise ValueError("costs applies to a gated replay: give gate too (a GateSettings or a Gate)")
    n_prompt = check_int("n_prompt", n_prompt, 1, n_ctx - 1)
    if isinstance(gate, GateSettings):
        curve = cost_prior("llama.cpp", None) if costs is None else [float(c) for c in check_costs(costs)]
        gate = Gate(extend_costs(curve, n_draft + 1), gate)
    elif not isinstance(gate, Gate):
        raise TypeError(f"gate must be a GateSettings, a Gate or None, got {type(gate).__name__}")
    elif costs is not None:
        raise ValueError("costs: a Gate decides on its own curve; give costs with a GateSettings instead")
    if not isinstance(drafter, CoreSequenceDrafter):
        raise ValueError(f"gate: a gated replay needs a drafter with a compiled core, and "
                         f"{_drafter_name(drafter)} has none")
    core = drafter._impl
    drafter.reset([])  # the drafter's own buffer would no longer describe its core after the replay
    curve = list(gate.curve())
    r, offered, declined = _core.replay_gated_drafter(core, arr, n_ctx, n_draft, n_prompt, gate._core,
                                                      int(drafter._SOURCE), progress)
    fields = {f: getattr(r, f) for f in _DRAFTER_FIELDS}
    n_generated = fields["n_chunks"] * (n_ctx - n_prompt)
    hist = fields["draft_length_hist"]
    modelled = 0.0
    for k, n in enumerate(hist):  # the steps' cost, shortest drafts first
        if n:
            modelled += n * curve[k]
    n_steps = fields["n_steps"]
    figures = GateFigures(costs=curve, n_offered=int(offered), n_declined=int(declined), n_generated=n_generated,
                          modelled_time=modelled, speedup=n_generated / modelled if modelled else math.nan,
                          drafting_share=(n_steps - hist[0]) / n_steps if n_steps else math.nan)
    n_input = int(arr.size)
    return ReplayStats(n_draft=n_draft, n_ctx=n_ctx, n_input=n_input, n_predict=n_input - n_input % n_ctx,
                       t_draft_flat=0.0, t_draft=r.t_draft_ns * 1e-9, t_replay=r.t_replay_ns * 1e-9,
                       drafter=_drafter_name(drafter), peak_rss_bytes=peak_rss_bytes(), gate=figures, **fields)


_DRAFTER_FIELDS = ("n_chunks", "n_steps", "n_drafted", "n_accept", "draft_length_hist", "accept_length_hist",
                   "drafted_by_position", "accepted_by_position")
_PROGRESS_EVERY = 100_000  # tokens between progress calls, as the compiled replay


def _replay_in_python(drafter, arr: np.ndarray, n_ctx: int, n_draft: int, progress):
    """The compiled replay's loop through the drafter's Python methods: (fields, t_draft, t_replay)."""
    from ngramcache.drafters.base import SequenceDrafter

    draft_hist, accept_hist = [0] * (n_draft + 1), [0] * (n_draft + 1)
    by_pos_drafted, by_pos_accepted = [0] * n_draft, [0] * n_draft
    n_chunks = (arr.size - 1) // n_ctx
    total = n_chunks * n_ctx
    n_steps = n_drafted = n_accept = 0
    t_draft = 0.0
    next_report = _PROGRESS_EVERY
    # as in the compiled replay, the drafter's own n_draft does not cut proposals
    saved = drafter.n_draft if isinstance(drafter, SequenceDrafter) else None
    if saved is not None:
        drafter.n_draft = n_draft
    t_loop = time.perf_counter()
    try:
        for c in range(n_chunks):
            chunk = arr[c * n_ctx : (c + 1) * n_ctx]
            chunk_list = chunk.tolist()
            t0 = time.perf_counter()
            drafter.reset(chunk[:1])
            t_draft += time.perf_counter() - t0
            have = 1
            while have < n_ctx:
                t0 = time.perf_counter()
                proposal = np.asarray(drafter.propose(n_draft))[:n_draft].tolist()
                t_draft += time.perf_counter() - t0
                nd = len(proposal)
                acc = 0
                while acc < nd and have + acc < n_ctx and chunk_list[have + acc] == proposal[acc]:
                    acc += 1
                n_steps += 1
                n_drafted += nd
                n_accept += acc
                draft_hist[nd] += 1
                for j in range(nd):
                    by_pos_drafted[j] += 1
                for j in range(acc):
                    by_pos_accepted[j] += 1
                if nd:
                    accept_hist[acc] += 1
                n_new = min(acc + 1, n_ctx - have)
                t0 = time.perf_counter()
                drafter.accept(chunk[have : have + n_new])
                t_draft += time.perf_counter() - t0
                have += n_new
                done = c * n_ctx + have
                if progress is not None and done >= next_report:
                    progress(done, total)
                    next_report = done + _PROGRESS_EVERY
    finally:
        if saved is not None:
            drafter.n_draft = saved
    t_replay = time.perf_counter() - t_loop
    if progress is not None:
        progress(total, total)
    fields = dict(n_chunks=n_chunks, n_steps=n_steps, n_drafted=n_drafted, n_accept=n_accept,
                  draft_length_hist=draft_hist, accept_length_hist=accept_hist,
                  drafted_by_position=by_pos_drafted, accepted_by_position=by_pos_accepted)
    return fields, t_draft, t_replay


def _drafter_name(drafter) -> str:
    from ngramcache.drafters.registry import name_of

    return name_of(drafter) or type(drafter).__name__
