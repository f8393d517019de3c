"""The figures of an offline replay: ``ReplayStats`` (what ``ngramcache.replays.replay`` and
``replay_drafter`` return, with its summary, table, plot and JSON) and ``GateFigures`` (what
a gated replay modelled). See docs/cli.md for every figure.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from ngramcache.files import atomic_open

__all__ = ["GateFigures", "ReplayStats", "SOURCES"]

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
