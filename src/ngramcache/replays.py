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
from ngramcache.files import atomic_open, open_cache
from ngramcache.progress import peak_rss_bytes
from ngramcache.static_table import StaticTable

__all__ = ["GateFigures", "ReplayStats", "replay", "replay_drafter", "SOURCES"]

SOURCES = ("context", "dynamic", "static")


def _f32(x) -> np.float32:
    return np.float32(x)


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


@dataclasses.dataclass
class GateFigures:
    """What a gated replay (``replay_drafter(..., gate=...)``) modelled. A step that
    verifies k drafted tokens costs ``costs[k]`` one-token steps (``costs[0]`` = 1, a plain
    step); plain decoding costs one step per token.

    ``costs``: the curve the gate decided on; ``n_offered``: steps whose drafter proposed
    something; ``n_declined``: of those, the steps the gate cut to nothing; ``n_generated``:
    the tokens the steps produced (every replayed token but each chunk's prompt);
    ``modelled_time``: the steps' cost, in one-token steps; ``speedup``: ``n_generated /
    modelled_time``, the speed-up over plain decoding; ``drafting_share``: the share of
    steps that drafted."""

    costs: list
    n_offered: int
    n_declined: int
    n_generated: int
    modelled_time: float
    speedup: float
    drafting_share: float


@dataclasses.dataclass
class ReplayStats:
    """The result of ``replay``. Times are in seconds; counts are token counts.

    The first fields are llama-lookup-stats' own (``n_predict`` is its formula
    ``n_input - n_input % n_ctx``, which over-reports by ``n_ctx`` when the input is an
    exact multiple of it: that last chunk is not replayed). ``t_draft_flat`` is the time
    spent loading the static and dynamic caches given as paths (0 for objects), as in
    llama.cpp; ``t_draft`` covers the draft calls and context-cache updates only.
    """

    n_draft: int
    n_ctx: int
    n_input: int
    n_predict: int
    n_drafted: int
    n_accept: int
    t_draft_flat: float
    t_draft: float
    n_chunks: int = 0
    n_steps: int = 0
    t_replay: float = 0.0
    drafted_by_source: dict = dataclasses.field(default_factory=dict)
    accepted_by_source: dict = dataclasses.field(default_factory=dict)
    drafted_by_ngram: dict = dataclasses.field(default_factory=dict)
    accepted_by_ngram: dict = dataclasses.field(default_factory=dict)
    draft_length_hist: list = dataclasses.field(default_factory=list)
    accept_length_hist: list = dataclasses.field(default_factory=list)
    drafted_by_position: list = dataclasses.field(default_factory=list)
    accepted_by_position: list = dataclasses.field(default_factory=list)
    overlap_positions: int = 0
    overlap_text: int = 0
    overlap_static: int = 0
    overlap_dynamic: int = 0
    overlap_any: int = 0
    static_kind: str = "none"
    drafter: str = "lookup"   # what drafted: llama.cpp's lookup, or another drafter's name
    static_load_s: float | None = None
    dynamic_load_s: float | None = None
    peak_rss_bytes: int = 0
    gate: GateFigures | None = None  # a gated replay's figures (replay_drafter's gate)

    # -- derived figures ------------------------------------------------------------------
    @property
    def n_replayed(self) -> int:
        """Tokens actually replayed (n_chunks * n_ctx)."""
        return self.n_chunks * self.n_ctx

    @property
    def accept(self) -> float:
        """n_accept / n_drafted (NaN when nothing was drafted)."""
        return _ratio(self.n_accept, self.n_drafted)

    @property
    def us_per_drafted(self) -> float:
        return _ratio(self.t_draft * 1e6, self.n_drafted)

    @property
    def replay_tokens_per_s(self) -> float:
        return _ratio(self.n_replayed, self.t_replay)

    @property
    def overlap(self) -> float:
        """Share of replayed positions whose preceding 2-gram was known (text, static or dynamic)."""
        return _ratio(self.overlap_any, self.overlap_positions)

    # -- output ---------------------------------------------------------------------------
    def summary(self) -> str:
        """llama-lookup-stats' closing block, same labels and number formats (plain log mode).

        llama.cpp computes ``us per token`` and ``accept`` in float32; so does this. With
        nothing drafted they print ``nan``/``inf`` as llama.cpp's printf would."""
        t_us = self.t_draft * 1e6
        if self.n_drafted:
            per_tok = float(_f32(t_us) / _f32(self.n_drafted))
            accept = float(_f32(_f32(100.0) * _f32(self.n_accept)) / _f32(self.n_drafted))
        else:
            per_tok = math.inf if t_us > 0 else math.nan
            accept = math.nan
        tok_per_s = self.n_drafted / (1e-6 * t_us) if t_us > 0 else (math.nan if self.n_drafted == 0 else math.inf)
        lines = [
            "",
            f"n_draft      = {self.n_draft}",
            f"n_predict    = {self.n_predict}",
            f"n_drafted    = {self.n_drafted}",
            f"t_draft_flat = {self.t_draft_flat * 1e3:.2f} ms",
            f"t_draft      = {t_us * 1e-3:.2f} ms, {per_tok:.2f} us per token, {tok_per_s:.2f} tokens per second",
            f"n_accept     = {self.n_accept}",
            f"accept       = {accept:.3f}%",
        ]
        return "\n".join(lines) + "\n"

    def table(self) -> str:
        """The extra figures as a readable text table."""
        from ngramcache.progress import fmt_bytes

        def pct(num, den):
            r = _ratio(num, den)
            return "     -" if math.isnan(r) else f"{100 * r:6.2f}%"

        out = []
        w = 28
        out.append("replay")
        out.append(f"  {'chunks':<{w}}{self.n_chunks} x {self.n_ctx} tokens = {self.n_replayed:,} "
                   f"of {self.n_input:,} input tokens")
        out.append(f"  {'draft steps':<{w}}{self.n_steps:,} ({self.n_drafted / self.n_steps if self.n_steps else 0:.3f} "
                   f"drafted, {(self.n_accept + self.n_steps) / self.n_steps if self.n_steps else 0:.3f} "
                   "tokens gained per step incl. the sampled one)")
        out.append(f"  {'draft time per drafted':<{w}}{self.us_per_drafted:.3f} us")
        out.append(f"  {'replay wall time':<{w}}{self.t_replay:.3f} s ({self.replay_tokens_per_s:,.0f} tokens/s)")
        if self.static_load_s is not None:
            out.append(f"  {'static load (' + self.static_kind + ')':<{w}}{self.static_load_s * 1e3:.3f} ms")
        if self.dynamic_load_s is not None:
            out.append(f"  {'dynamic load':<{w}}{self.dynamic_load_s * 1e3:.3f} ms")
        out.append(f"  {'peak RSS':<{w}}{fmt_bytes(self.peak_rss_bytes)}")
        out.append("")
        if self.drafter == "lookup":  # where lookup's drafts came from
            out.append("overlap: positions whose preceding 2-gram was seen before")
            for label, n in (("in the replayed text", self.overlap_text), ("in the static cache", self.overlap_static),
                             ("in the dynamic cache", self.overlap_dynamic), ("in any of them", self.overlap_any)):
                out.append(f"  {label:<{w}}{pct(n, self.overlap_positions)}  ({n:,} of {self.overlap_positions:,})")
            out.append("")
            out.append(f"  {'by source':<16}{'drafted':>10}{'accepted':>10}{'accept':>9}{'share of accepted':>19}")
            for s in SOURCES:
                d, a = self.drafted_by_source.get(s, 0), self.accepted_by_source.get(s, 0)
                out.append(f"  {s:<16}{d:>10,}{a:>10,}{pct(a, d):>9}{pct(a, self.n_accept):>19}")
            out.append("")
            out.append(f"  {'by n-gram size':<16}{'drafted':>10}{'accepted':>10}{'accept':>9}{'share of accepted':>19}")
            for k in range(1, 5):
                d, a = self.drafted_by_ngram.get(k, 0), self.accepted_by_ngram.get(k, 0)
                out.append(f"  {k:<16}{d:>10,}{a:>10,}{pct(a, d):>9}{pct(a, self.n_accept):>19}")
            out.append("")
        else:
            out.append(f"drafter: {self.drafter}")
            out.append("")
        if self.gate is not None:
            g = self.gate
            out.append("gate: each step verifies what the gate keeps of the proposal; a step of k drafted "
                       "tokens costs cost(k+1), a plain step 1")
            out.append(f"  {'modelled speed-up':<{w}}{g.speedup:.3f}x ({g.n_generated:,} tokens in "
                       f"{g.modelled_time:,.1f} one-token steps)")
            n_drafting = self.n_steps - self.draft_length_hist[0]
            out.append(f"  {'steps that drafted':<{w}}{100 * g.drafting_share:.2f}% "
                       f"({n_drafting:,} of {self.n_steps:,})")
            out.append(f"  {'proposals declined':<{w}}{g.n_declined:,} of {g.n_offered:,}")
            out.append(f"  {'cost curve':<{w}}" + ", ".join(f"{c:.2f}" for c in g.costs))
            out.append("")
        out.append(f"  {'draft position':<16}{'drafted':>10}{'accepted':>10}{'accept':>9}")
        for i, (d, a) in enumerate(zip(self.drafted_by_position, self.accepted_by_position)):
            out.append(f"  {i + 1:<16}{d:>10,}{a:>10,}{pct(a, d):>9}")
        out.append("")
        n_nonempty = sum(self.accept_length_hist)
        out.append(f"  {'draft length':<16}{'steps':>10}{'share':>9}   "
                   f"{'accepted length':<16}{'drafts':>10}{'share':>9}")
        for k in range(len(self.draft_length_hist)):
            dl = self.draft_length_hist[k]
            al = self.accept_length_hist[k]
            out.append(f"  {k:<16}{dl:>10,}{pct(dl, self.n_steps):>9}   {k:<16}{al:>10,}{pct(al, n_nonempty):>9}")
        return "\n".join(out) + "\n"

    def plot(self, path: str | os.PathLike) -> None:
        """Draw acceptance by draft position and by source to a PNG (needs matplotlib).

        The file is written atomically (temporary file, fsync, rename)."""
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ImportError("ReplayStats.plot needs matplotlib: pip install 'ngramcache[plot]'") from None
        # A bare Figure renders with Agg and leaves pyplot's global state alone.
        from matplotlib.figure import Figure

        fig = Figure(figsize=(10, 4), layout="constrained")
        ax1, ax2 = fig.subplots(1, 2)
        pos = np.arange(1, len(self.drafted_by_position) + 1)
        ax1.bar(pos - 0.2, self.drafted_by_position, width=0.4, label="drafted", color="#9ecae1")
        ax1.bar(pos + 0.2, self.accepted_by_position, width=0.4, label="accepted", color="#3182bd")
        ax1.set_xlabel("draft position")
        ax1.set_ylabel("tokens")
        if len(pos) <= 16:  # longer drafts: let matplotlib pick readable ticks
            ax1.set_xticks(pos)
        ax1.legend(loc="upper right")
        rate = ax1.twinx()
        rate.plot(pos, [100 * _ratio(a, d) for a, d in zip(self.accepted_by_position, self.drafted_by_position)],
                  "o-", color="#e6550d")
        rate.set_ylabel("accepted, % of drafted", color="#e6550d")
        rate.set_ylim(0, 100)
        ax1.set_title("acceptance by draft position")
        x = np.arange(len(SOURCES))
        ax2.bar(x - 0.2, [self.drafted_by_source.get(s, 0) for s in SOURCES], width=0.4, label="drafted",
                color="#a1d99b")
        ax2.bar(x + 0.2, [self.accepted_by_source.get(s, 0) for s in SOURCES], width=0.4, label="accepted",
                color="#31a354")
        for i, s in enumerate(SOURCES):
            r = _ratio(self.accepted_by_source.get(s, 0), self.drafted_by_source.get(s, 0))
            if not math.isnan(r):
                ax2.annotate(f"{100 * r:.1f}%", (i + 0.2, self.accepted_by_source.get(s, 0)),
                             ha="center", va="bottom", fontsize=8)
        ax2.set_xticks(x, SOURCES)
        ax2.set_ylabel("tokens")
        ax2.legend(loc="upper right")
        ax2.set_title("acceptance by source")
        fig.suptitle(f"n_draft {self.n_draft}, n_ctx {self.n_ctx}: {self.n_accept:,} of {self.n_drafted:,} "
                     f"drafted tokens accepted ({100 * self.accept:.2f}%)" if self.n_drafted else
                     f"n_draft {self.n_draft}, n_ctx {self.n_ctx}: nothing drafted")
        with atomic_open(path) as f:
            fig.savefig(f, format="png", dpi=100)

    def to_dict(self) -> dict:
        """Every field and derived figure, JSON-ready (NaN becomes None); ``gate`` only for a
        gated replay."""
        d = dataclasses.asdict(self)
        for k in ("drafted_by_ngram", "accepted_by_ngram"):
            d[k] = {str(n): v for n, v in d[k].items()}
        d.update(n_replayed=self.n_replayed, accept=self.accept, us_per_drafted=self.us_per_drafted,
                 replay_tokens_per_s=self.replay_tokens_per_s, overlap=self.overlap)
        if d["gate"] is None:  # an ungated replay has no gate figures
            del d["gate"]
        else:
            d["gate"] = _finite(d["gate"])
        return _finite(d)


def _finite(d: dict) -> dict:
    """``d`` with its numbers that are not finite as None (JSON has no NaN)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


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
                          modelled_time=modelled, speedup=_ratio(n_generated, modelled),
                          drafting_share=_ratio(n_steps - hist[0], n_steps))
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
