"""Core benchmark: update throughput and drafting cost on >= 1 M real tokens.

Run (not part of the default test run, which collects tests/ only):

    .venv/bin/python -m pytest bench/bench_core.py -s -p no:cacheprovider --benchmark-columns=min,mean,rounds

Token stream: the first N_TOKENS of the Python standard library's own source, tokenized
by the fixed scheme of bench/stdlib_stream.py (the same on every machine with the same
Python version; cached as raw int32 in the temp folder).

The workload is the vectors' replay loop (tests/test_vectors.py): for each position,
append the token, update the context cache with nnew=1 (n-gram sizes 1..4), draft up to
8 tokens. Figures, printed at the end (run with -s):
- update throughput: bulk (one call over the stream) and incremental (one call per token);
- draft cost: (time of update+draft loop - time of update-only loop) / drafted tokens;
- the per-call Python overhead (a draft call on a 4-token sequence that drafts nothing);
- the C++-side loop ``ngramcache.replay`` (llama-lookup-stats' loop: one chunk over the
  whole stream, drafting only where a new step starts, so fewer drafts than positions);
- the pure-Python reference (tests/reference.py) on the first REF_SLICE tokens, beside
  ngramcache's Python loop on the same slice (and both must draft the same tokens).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ngramcache as nc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import reference as ref  # noqa: E402
import stdlib_stream as stream  # noqa: E402

N_TOKENS = 1_200_000
N_DRAFT = 8
REF_SLICE = 20_000

FIGURES: dict[str, str] = {}


def stdlib_tokens(n: int = N_TOKENS) -> np.ndarray:
    try:
        return stream.stdlib_tokens(n)
    except stream.StreamTooShort as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    t = stdlib_tokens()
    FIGURES["stream"] = stream.describe(t)
    return t


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if FIGURES:
        print("\n\n## bench_core figures")
        for k, v in FIGURES.items():
            print(f"- {k}: {v}")


# --- loops -----------------------------------------------------------------------

def update_loop(tokens: np.ndarray) -> nc.NgramCache:
    ctx = nc.NgramCache()
    update = ctx.update
    for pos in range(2, tokens.size + 1):
        update(tokens[:pos], 1, 4, 1)
    return ctx


def replay_loop(tokens: np.ndarray) -> tuple[int, int]:
    """(drafted tokens, positions with a non-empty draft)."""
    ctx = nc.NgramCache()
    update, draft = ctx.update, nc.draft
    drafted = nonempty = 0
    for pos in range(1, tokens.size + 1):
        inp = tokens[:pos]
        if pos >= 2:
            update(inp, 1, 4, 1)
        k = draft(inp, N_DRAFT, ctx).size
        drafted += k
        nonempty += k > 0
    return drafted, nonempty


def replay_drafts(tokens: np.ndarray) -> list[list[int]]:
    ctx = nc.NgramCache()
    out = []
    for pos in range(1, tokens.size + 1):
        inp = tokens[:pos]
        if pos >= 2:
            ctx.update(inp, 1, 4, 1)
        out.append(nc.draft(inp, N_DRAFT, ctx).tolist())
    return out


def reference_drafts(tokens: list[int]) -> list[list[int]]:
    """The reference reads only the newest tokens (5 for update with nnew=1, 4 for a
    draft); passing just those keeps its cost per position constant, as ngramcache's,
    instead of copying the whole prefix each time."""
    ctx: dict = {}
    out = []
    for pos in range(1, len(tokens) + 1):
        if pos >= 2:
            ref.update(ctx, tokens[max(0, pos - 5):pos], 1, 4, 1)
        out.append(ref.draft(tokens[max(0, pos - 4):pos], N_DRAFT, ctx))
    return out


def timed(fn, *args):
    t0 = time.perf_counter()
    r = fn(*args)
    return time.perf_counter() - t0, r


# --- benchmarks ------------------------------------------------------------------

def test_update_bulk(benchmark, tokens):
    def run():
        c = nc.NgramCache()
        c.update(tokens, 1, 4)
        return c

    cache = benchmark.pedantic(run, rounds=3, iterations=1)
    best = benchmark.stats.stats.min
    FIGURES["update, bulk (one call, sizes 1..4)"] = (
        f"{tokens.size / best / 1e6:.2f} M tokens/s ({4 * tokens.size / best / 1e6:.2f} M observations/s; "
        f"best of 3: {best:.3f} s; {len(cache):,} n-grams)")


def test_update_incremental(benchmark, tokens):
    cache = benchmark.pedantic(update_loop, args=(tokens,), rounds=1, iterations=1)
    t = benchmark.stats.stats.min
    FIGURES["update, incremental (nnew=1 per token, Python loop)"] = (
        f"{tokens.size / t / 1e6:.3f} M tokens/s ({t / tokens.size * 1e9:.0f} ns per call)")
    FIGURES["_t_update_loop"] = str(t)
    bulk = nc.NgramCache()
    bulk.update(tokens, 1, 4)
    assert len(cache) == len(bulk)


def test_replay_draft_every_position(benchmark, tokens):
    drafted, nonempty = benchmark.pedantic(replay_loop, args=(tokens,), rounds=1, iterations=1)
    t = benchmark.stats.stats.min
    t_upd = float(FIGURES.pop("_t_update_loop")) if "_t_update_loop" in FIGURES else timed(update_loop, tokens)[0]
    t_draft = t - t_upd
    benchmark.extra_info.update(drafted=drafted, positions=int(tokens.size), t_update=t_upd)
    FIGURES["replay (update + draft 8 at every position, Python loop)"] = (
        f"{t:.2f} s for {tokens.size:,} positions ({t / tokens.size * 1e9:.0f} ns per position); "
        f"{drafted:,} drafted tokens at {nonempty:,} positions")
    FIGURES["draft cost (replay - update-only loop)"] = (
        f"{t_draft / drafted * 1e9:.0f} ns per drafted token, {t_draft / tokens.size * 1e9:.0f} ns per draft call")


def test_draft_call_overhead(benchmark):
    """A draft call that finds nothing: what any Python-level caller pays per call."""
    ctx = nc.NgramCache()
    seq = np.array([1, 2, 3, 4], dtype=np.int32)
    n = 200_000

    def run():
        for _ in range(n):
            nc.draft(seq, N_DRAFT, ctx)

    benchmark.pedantic(run, rounds=3, iterations=1)
    FIGURES["Python per-call overhead (draft that drafts nothing)"] = f"{benchmark.stats.stats.min / n * 1e9:.0f} ns per call"


def test_replay_cpp(benchmark, tokens):
    if not hasattr(nc, "replay"):
        pytest.skip("ngramcache.replay is not available")

    def run():
        return nc.replay(tokens, n_ctx=tokens.size - 1, n_draft=N_DRAFT)

    r = benchmark.pedantic(run, rounds=1, iterations=1)
    FIGURES["C++ loop: ngramcache.replay (llama-lookup-stats loop, 1 chunk)"] = (
        f"{r.us_per_drafted * 1e3:.0f} ns per drafted token (t_draft {r.t_draft:.2f} s, "
        f"{r.n_drafted:,} drafted, {r.n_steps:,} steps, accept {100 * r.accept:.1f} %); "
        f"replay {r.replay_tokens_per_s / 1e6:.2f} M tokens/s")


def test_reference_ratio(benchmark, tokens):
    """The pure-Python reference and ngramcache's loop on the same slice, same run."""
    sl = tokens[:REF_SLICE]
    t_ref, want = timed(reference_drafts, sl.tolist())
    got = benchmark.pedantic(replay_drafts, args=(sl,), rounds=3, iterations=1)
    t_ours = benchmark.stats.stats.min
    assert got == want  # the benchmark checks its own result
    drafted = sum(map(len, want))
    FIGURES[f"reference vs ngramcache, first {REF_SLICE:,} tokens (update + draft loop)"] = (
        f"reference {t_ref:.2f} s ({t_ref / drafted * 1e9:,.0f} ns per drafted token), ngramcache "
        f"{t_ours:.3f} s ({t_ours / drafted * 1e9:,.0f} ns per drafted token, Python loop): "
        f"{t_ref / t_ours:.0f}x faster; {drafted:,} drafted tokens, identical drafts")


def test_reference_ratio_warm(benchmark, tokens):
    """Same comparison deep into the stream: both caches first take the first WARM tokens
    in one bulk update (same parts, same first-seen order as the incremental loop), then
    REF_SLICE positions are replayed. Parts are large here (common 1- and 2-grams have
    thousands of continuations), which is where the reference's full scans cost."""
    warm = tokens.size - REF_SLICE
    sl = tokens[warm:]
    model: dict = {}
    ref.update(model, tokens[:warm].tolist(), 1, 4)
    full = tokens.tolist()

    def run_ref():
        out = []
        for pos in range(warm + 1, tokens.size + 1):
            ref.update(model, full[pos - 5:pos], 1, 4, 1)
            out.append(ref.draft(full[pos - 4:pos], N_DRAFT, model))
        return out

    def run_ours():
        ctx = nc.NgramCache()
        ctx.update(tokens[:warm], 1, 4)
        t0 = time.perf_counter()
        out = []
        for pos in range(warm + 1, tokens.size + 1):
            inp = tokens[:pos]
            ctx.update(inp, 1, 4, 1)
            out.append(nc.draft(inp, N_DRAFT, ctx).tolist())
        return time.perf_counter() - t0, out

    t_ref, want = timed(run_ref)
    t_ours, got = benchmark.pedantic(run_ours, rounds=1, iterations=1)
    assert got == want
    drafted = sum(map(len, want))
    FIGURES[f"reference vs ngramcache, positions {warm:,}..{tokens.size:,} after a bulk warm-up"] = (
        f"reference {t_ref:.2f} s ({t_ref / drafted * 1e9:,.0f} ns per drafted token), ngramcache "
        f"{t_ours:.3f} s ({t_ours / drafted * 1e9:,.0f} ns per drafted token, Python loop): "
        f"{t_ref / t_ours:.0f}x faster; {drafted:,} drafted tokens, identical drafts")
