"""Paired benchmarks of the core: ``NgramCache.update``, ``draft`` with and without a static
cache (an ``NgramCache``, or a memory-mapped ``StaticTable``), opening a static table, and
``replay``. Each group times ngramcache beside a baseline on the same tokens in the same
run: the pure-Python reference model (tests/reference.py, plain dicts) or, for opening a
static table, loading llama.cpp's own file format; and every benchmark checks that both
sides give the same result.

Text: the Python standard library's source (bench/stdlib_stream.py); a static cache is
counted from its first 150k tokens, the text being drafted comes after (bench/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import ngramcache as nc
import reference as ref
from bench_core import update_loop as ngramcache_update_per_token
from pairs import BASELINE_ROUNDS, NGRAMCACHE_ROUNDS, baseline_side, ngramcache_side

N_DRAFT = 8  # llama.cpp's lookup default
REFERENCE = "reference (dicts)"


def as_dict(cache) -> dict:
    """A cache's or static table's contents, {ngram: {token: count}}, order aside (the
    draft benchmarks check the order where it matters: in the drafts)."""
    return {key: dict(part) for key, part in cache.items()}


# --- update ---------------------------------------------------------------------------

UPDATE_TOKENS = 50_000
UPDATE = f"update: one call over {UPDATE_TOKENS // 1000}k tokens, n-gram sizes 1..4"
UPDATE_PER_TOKEN_TOKENS = 20_000
UPDATE_PER_TOKEN = f"update: one call per token (nnew=1), {UPDATE_PER_TOKEN_TOKENS // 1000}k tokens"


def ngramcache_update(tokens: np.ndarray) -> nc.NgramCache:
    cache = nc.NgramCache()
    cache.update(tokens, 1, 4)
    return cache


def reference_update(tokens: list[int]) -> dict:
    model: dict = {}
    ref.update(model, tokens, 1, 4)
    return model


def reference_update_per_token(tokens: list[int]) -> dict:
    model: dict = {}
    for end in range(2, len(tokens) + 1):
        # with nnew=1 the reference reads only the newest 5 tokens (the longest key and
        # its next token): passing just those keeps its cost per token constant, as
        # ngramcache's is, instead of copying the whole prefix each time
        ref.update(model, tokens[max(0, end - 5):end], 1, 4, 1)
    return model


@pytest.fixture(scope="module")
def update_tokens(stream) -> np.ndarray:
    return stream[:UPDATE_TOKENS]


def test_update_reference(benchmark, update_tokens, baseline_results):
    baseline_side(benchmark, UPDATE, REFERENCE)
    model = benchmark.pedantic(reference_update, args=(update_tokens.tolist(),), rounds=BASELINE_ROUNDS)
    baseline_results.keep(UPDATE, model)
    assert as_dict(ngramcache_update(update_tokens)) == model


def test_update_ngramcache(benchmark, update_tokens, baseline_results):
    ngramcache_side(benchmark, UPDATE, "NgramCache.update")
    cache = benchmark.pedantic(ngramcache_update, args=(update_tokens,), rounds=NGRAMCACHE_ROUNDS, warmup_rounds=1)
    want = baseline_results.get(UPDATE, lambda: reference_update(update_tokens.tolist()))
    assert as_dict(cache) == want


def test_update_per_token_reference(benchmark, stream, baseline_results):
    tokens = stream[:UPDATE_PER_TOKEN_TOKENS]
    baseline_side(benchmark, UPDATE_PER_TOKEN, REFERENCE)
    model = benchmark.pedantic(reference_update_per_token, args=(tokens.tolist(),), rounds=BASELINE_ROUNDS)
    baseline_results.keep(UPDATE_PER_TOKEN, model)
    assert as_dict(ngramcache_update_per_token(tokens)) == model


def test_update_per_token_ngramcache(benchmark, stream, baseline_results):
    tokens = stream[:UPDATE_PER_TOKEN_TOKENS]
    ngramcache_side(benchmark, UPDATE_PER_TOKEN, "NgramCache.update")
    cache = benchmark.pedantic(ngramcache_update_per_token, args=(tokens,), rounds=NGRAMCACHE_ROUNDS,
                               warmup_rounds=1)
    want = baseline_results.get(UPDATE_PER_TOKEN, lambda: reference_update_per_token(tokens.tolist()))
    assert as_dict(cache) == want


# --- draft ----------------------------------------------------------------------------
# The context cache holds the document's first DRAFT_AT tokens; drafting then happens at
# the DRAFT_POSITIONS positions that follow (the caches are not updated, so every round
# does the same work).

DRAFT_AT = 40_000
DRAFT_POSITIONS = 1_000
DRAFT_ENDS = range(DRAFT_AT, DRAFT_AT + DRAFT_POSITIONS)  # draft after tokens[:end]
DRAFT_CONTEXT = f"draft: context cache of {DRAFT_AT // 1000}k tokens, {DRAFT_POSITIONS:,} positions"
DRAFT_STATIC = f"draft: context + static cache, {DRAFT_POSITIONS:,} positions"


@pytest.fixture(scope="module")
def context_cache(document) -> nc.NgramCache:
    return ngramcache_update(document[:DRAFT_AT])


@pytest.fixture(scope="module")
def context_model(document) -> dict:
    return reference_update(document[:DRAFT_AT].tolist())


@pytest.fixture(scope="module")
def static_cache(static_corpus) -> nc.NgramCache:
    # a static cache holds 2-grams, as llama-lookup-create counts them
    cache = nc.NgramCache()
    cache.update(static_corpus, 2, 2)
    return cache


@pytest.fixture(scope="module")
def static_model(static_corpus) -> dict:
    model: dict = {}
    ref.update(model, static_corpus.tolist(), 2, 2)
    return model


@pytest.fixture(scope="module")
def static_files(static_cache, tmp_path_factory) -> dict:
    """The static cache written both ways: {"ngst": NGST file, "lookup.bin": llama.cpp's}."""
    folder = tmp_path_factory.mktemp("static")
    table = nc.StaticTable.from_cache(static_cache, 2)
    paths = {"ngst": folder / "static.ngst", "lookup.bin": folder / "static.lookup.bin"}
    table.save(paths["ngst"])
    table.to_llama(paths["lookup.bin"])
    return paths


@pytest.fixture(scope="module")
def static_table(static_files) -> nc.StaticTable:
    table = nc.StaticTable.open(static_files["ngst"])
    assert table.mapped
    return table


def ngramcache_drafts(tokens: np.ndarray, context: nc.NgramCache, static=None) -> list[np.ndarray]:
    draft = nc.draft
    return [draft(tokens[:end], N_DRAFT, context, static=static) for end in DRAFT_ENDS]


def reference_drafts(tokens: list[int], context: dict, static: dict | None = None) -> list[list[int]]:
    # the reference reads only the newest 4 tokens (the longest key): passing just those
    # keeps it from copying the whole prefix at every position
    return [ref.draft(tokens[end - 4:end], N_DRAFT, context, static=static) for end in DRAFT_ENDS]


def check_drafts(benchmark, got: list, want: list[list[int]]) -> None:
    assert [d.tolist() if isinstance(d, np.ndarray) else d for d in got] == want
    drafted = sum(map(len, want))
    assert drafted > DRAFT_POSITIONS // 2, "the workload should draft: it measures drafting"
    benchmark.extra_info["drafted_tokens"] = drafted


@pytest.fixture(scope="module")
def draft_text(document) -> np.ndarray:
    return document[:DRAFT_AT + DRAFT_POSITIONS]


def test_draft_context_reference(benchmark, draft_text, context_cache, context_model, baseline_results):
    baseline_side(benchmark, DRAFT_CONTEXT, REFERENCE)
    want = benchmark.pedantic(reference_drafts, args=(draft_text.tolist(), context_model), rounds=BASELINE_ROUNDS)
    baseline_results.keep(DRAFT_CONTEXT, want)
    check_drafts(benchmark, ngramcache_drafts(draft_text, context_cache), want)


def test_draft_context_ngramcache(benchmark, draft_text, context_cache, context_model, baseline_results):
    ngramcache_side(benchmark, DRAFT_CONTEXT, "draft")
    got = benchmark.pedantic(ngramcache_drafts, args=(draft_text, context_cache), rounds=NGRAMCACHE_ROUNDS,
                             warmup_rounds=1)
    want = baseline_results.get(DRAFT_CONTEXT, lambda: reference_drafts(draft_text.tolist(), context_model))
    check_drafts(benchmark, got, want)


def test_draft_static_reference(benchmark, draft_text, context_cache, context_model, static_model, static_table,
                                baseline_results):
    baseline_side(benchmark, DRAFT_STATIC, REFERENCE)
    want = benchmark.pedantic(reference_drafts, args=(draft_text.tolist(), context_model, static_model),
                              rounds=BASELINE_ROUNDS)
    baseline_results.keep(DRAFT_STATIC, want)
    check_drafts(benchmark, ngramcache_drafts(draft_text, context_cache, static_table), want)


@pytest.mark.parametrize("static_kind", ["NgramCache", "StaticTable"])
def test_draft_static_ngramcache(benchmark, static_kind, draft_text, context_cache, context_model, static_model,
                                 static_cache, static_table, baseline_results):
    static = static_cache if static_kind == "NgramCache" else static_table
    label = "draft, static NgramCache" if static_kind == "NgramCache" else "draft, static StaticTable (mapped NGST)"
    ngramcache_side(benchmark, DRAFT_STATIC, label)
    got = benchmark.pedantic(ngramcache_drafts, args=(draft_text, context_cache, static), rounds=NGRAMCACHE_ROUNDS,
                             warmup_rounds=1)
    want = baseline_results.get(DRAFT_STATIC,
                                lambda: reference_drafts(draft_text.tolist(), context_model, static_model))
    check_drafts(benchmark, got, want)


# --- opening a static table -------------------------------------------------------------
# The baseline is what llama.cpp does at start-up (common_ngram_cache_load): parse every
# record of its lookup.bin into a hash map, here ngramcache's NgramCache.load. An NGST file
# is mapped instead, so opening it costs the same at any size.

STATIC_OPEN = "static table: open, 2-grams of 150k tokens"


def test_static_open_lookup_bin(benchmark, static_files, static_cache):
    baseline_side(benchmark, STATIC_OPEN, "NgramCache.load (llama.cpp's lookup.bin)")
    loaded = benchmark(nc.NgramCache.load, static_files["lookup.bin"])
    assert as_dict(loaded) == as_dict(static_cache)


def test_static_open_ngramcache(benchmark, static_files, static_cache):
    ngramcache_side(benchmark, STATIC_OPEN, "StaticTable.open (NGST, mapped)")
    table = benchmark(nc.StaticTable.open, static_files["ngst"])
    assert table.mapped
    assert as_dict(table) == as_dict(static_cache)


# --- replay ---------------------------------------------------------------------------

REPLAY_CTX = 1024
REPLAY_CHUNKS = 2
REPLAY = f"replay: {REPLAY_CHUNKS} chunks of {REPLAY_CTX:,} tokens, static table"


def reference_replay(tokens: list[int], n_ctx: int, n_draft: int, static: dict) -> tuple[int, int, int]:
    """llama-lookup-stats' loop, the one ``nc.replay`` runs in C++, on the reference model:
    each whole chunk of ``n_ctx`` tokens (followed by at least one more) starts from an
    empty context cache; a step drafts, keeps the drafted tokens that match the text and
    then the text's next token; each chunk's context cache is merged into the dynamic
    cache the later chunks draft from. Returns (steps, drafted, accepted)."""
    dynamic: dict = {}
    n_steps = n_drafted = n_accepted = 0
    for start in range(0, len(tokens) - n_ctx, n_ctx):
        chunk = tokens[start:start + n_ctx]
        context: dict = {}
        seq = chunk[:1]
        while len(seq) < n_ctx:
            # the newest 4 tokens are all the reference reads, except that llama_oob looks
            # at the length of a 2- or 3-token sequence, which seq[-4:] keeps
            proposal = ref.draft(seq[-4:], n_draft, context, dynamic, static, llama_oob=True)
            n_steps += 1
            n_drafted += len(proposal)
            for token in proposal:
                if len(seq) == n_ctx or chunk[len(seq)] != token:
                    break
                seq.append(token)
                ref.update(context, seq[-5:], 1, 4, nnew=1)
                n_accepted += 1
            if len(seq) < n_ctx:
                seq.append(chunk[len(seq)])
                ref.update(context, seq[-5:], 1, 4, nnew=1)
        ref.merge(dynamic, context)
    return n_steps, n_drafted, n_accepted


def ngramcache_replay(tokens: np.ndarray, n_ctx: int, n_draft: int, static) -> tuple[int, int, int]:
    stats = nc.replay(tokens, n_ctx, n_draft, static=static)
    return stats.n_steps, stats.n_drafted, stats.n_accept


@pytest.fixture(scope="module")
def replay_text(document) -> np.ndarray:
    return document[:REPLAY_CHUNKS * REPLAY_CTX + 1]


def test_replay_reference(benchmark, replay_text, static_model, static_table, baseline_results):
    baseline_side(benchmark, REPLAY, "reference loop (dicts)")
    want = benchmark.pedantic(reference_replay, args=(replay_text.tolist(), REPLAY_CTX, N_DRAFT, static_model),
                              rounds=BASELINE_ROUNDS)
    baseline_results.keep(REPLAY, want)
    assert ngramcache_replay(replay_text, REPLAY_CTX, N_DRAFT, static_table) == want
    assert want[2] > 0, "the workload should accept drafts"


def test_replay_ngramcache(benchmark, replay_text, static_model, static_table, baseline_results):
    ngramcache_side(benchmark, REPLAY, "replay (C++ loop)")
    got = benchmark.pedantic(ngramcache_replay, args=(replay_text, REPLAY_CTX, N_DRAFT, static_table),
                             rounds=NGRAMCACHE_ROUNDS, warmup_rounds=1)
    want = baseline_results.get(REPLAY,
                                lambda: reference_replay(replay_text.tolist(), REPLAY_CTX, N_DRAFT, static_model))
    assert got == want
    benchmark.extra_info.update(zip(("steps", "drafted", "accepted"), got))
