"""Seeded sampling: each position's draw is a Gumbel-max draw with noise keyed by
(seed, position), so sampled text with drafting equals plain sampled text token for token,
and every draw is a correct sample of the processed distribution (temperature, top-k,
top-p), checked with chi-square tests over many seeds and positions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import PROMPT, PROMPTS, reference, run_cli
from ngramcache import CopyDrafter, LookupDrafter, OracleDrafter, PromptCache, SuffixDrafter
from ngramcache.decoding.loop import Stream, generate
from ngramcache.decoding.sampling import Sampler, SeededSampler, gumbel_noise, make_sampler
from support import FakeModel, RejectingDrafter


# --- an independent statement of the documented draw ----------------------------------

def documented_noise(seed: int, position: int, n: int) -> np.ndarray:
    raw = np.random.PCG64(np.random.SeedSequence([seed, position])).random_raw(n)
    u = np.array([((int(r) >> 11) + 0.5) / 2.0 ** 53 for r in raw])
    return -np.log(-np.log(u))


def processed(row, temperature, top_k, top_p) -> dict[int, float]:
    """{token: processed logit} of the tokens a draw may pick, by plain sorting."""
    order = sorted(range(len(row)), key=lambda j: (-float(row[j]), j))
    if top_k:
        order = order[:top_k]
    best = float(row[order[0]])
    x = {j: (float(row[j]) - best) / temperature for j in order}
    if top_p < 1.0:
        total = sum(math.exp(v) for v in x.values())
        kept, mass = {}, 0.0
        for j in order:
            kept[j] = x[j]
            mass += math.exp(x[j])
            if mass >= top_p * total:
                break
        x = kept
    return x


def probabilities(row, temperature, top_k, top_p) -> np.ndarray:
    x = processed(row, temperature, top_k, top_p)
    p = np.zeros(len(row))
    for j, v in x.items():
        p[j] = math.exp(v)
    return p / p.sum()


def documented_draw(row, temperature, top_k, top_p, seed, position) -> int:
    x = processed(row, temperature, top_k, top_p)
    g = documented_noise(seed, position, len(row))
    return max(x, key=lambda j: (x[j] + g[j], -j))


# --- chi-square -----------------------------------------------------------------------

def chi2_sf(x: float, df: int) -> float:
    """P(chi-square with df degrees of freedom >= x): 1 - the regularized lower incomplete
    gamma function P(df/2, x/2), summed as its power series."""
    a, h = df / 2.0, x / 2.0
    if h <= 0:
        return 1.0
    term = total = 1.0 / a
    n = 0
    while term > total * 1e-16:
        n += 1
        term *= h / (a + n)
        total += term
    return max(0.0, 1.0 - math.exp(-h + a * math.log(h) - math.lgamma(a)) * total)


def chi2_test(counts: np.ndarray, p: np.ndarray) -> float:
    """The p-value of observed ``counts`` against probabilities ``p``; a count where p is
    0 fails outright (it must never be drawn)."""
    counts, p = counts.ravel(), p.ravel()
    assert counts[p == 0].sum() == 0, "a token outside the kept set was drawn"
    n = counts.sum()
    e = n * p[p > 0]
    stat = float(((counts[p > 0] - e) ** 2 / e).sum())
    return chi2_sf(stat, int((p > 0).sum()) - 1)


def test_chi2_sf_matches_known_quantiles():
    # the 0.95 and 0.999 quantiles of chi-square for 1, 4 and 10 degrees of freedom
    for x, df, q in [(3.841, 1, 0.05), (9.488, 4, 0.05), (18.307, 10, 0.05), (18.467, 4, 0.001),
                     (29.588, 10, 0.001)]:
        assert chi2_sf(x, df) == pytest.approx(q, rel=1e-3)


ROW = np.array([2.0, 1.4, 1.4, 0.6, -0.3, -1.0, -2.5], dtype=np.float32)
SETTINGS = [  # (temperature, top_k, top_p)
    (1.0, 0, 1.0), (0.6, 0, 1.0), (1.7, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.8), (0.8, 4, 0.9), (1.3, 0, 0.55),
]
N_DRAWS = 12000
P_MIN = 1e-3  # the draws are fixed by their seeds, so each test passes or fails every time


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_seeded_draws_over_seeds_follow_the_processed_distribution(temperature, top_k, top_p):
    counts = np.zeros(ROW.size, dtype=np.int64)
    for seed in range(N_DRAWS):
        counts[SeededSampler(temperature, top_k, top_p, seed=seed)(ROW, 17)] += 1
    assert chi2_test(counts, probabilities(ROW, temperature, top_k, top_p)) > P_MIN


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 4, 0.9)])
def test_seeded_draws_over_positions_follow_the_processed_distribution(temperature, top_k, top_p):
    s = SeededSampler(temperature, top_k, top_p, seed=12345)
    counts = np.bincount([s(ROW, pos) for pos in range(N_DRAWS)], minlength=ROW.size)
    assert chi2_test(counts, probabilities(ROW, temperature, top_k, top_p)) > P_MIN


def test_consecutive_positions_are_independent():
    # the joint counts of (token at 40, token at 41) over seeds against the product of
    # the marginals: noise shared or correlated between positions would show here
    row = np.array([0.8, 0.4, 0.0, -0.3], dtype=np.float32)
    p = probabilities(row, 1.0, 0, 1.0)
    joint = np.zeros((4, 4), dtype=np.int64)
    for seed in range(N_DRAWS):
        s = SeededSampler(1.0, seed=seed)
        joint[s(row, 40), s(row, 41)] += 1
    assert chi2_test(joint, np.outer(p, p)) > P_MIN


def test_large_vocabulary_with_top_k_draws_only_the_kept_tokens():
    row = np.random.default_rng(3).normal(0, 2, 5000).astype(np.float32)
    counts = np.zeros(row.size, dtype=np.int64)
    for seed in range(4000):
        counts[SeededSampler(1.2, 5, 1.0, seed=seed)(row, 3)] += 1
    assert chi2_test(counts, probabilities(row, 1.2, 5, 1.0)) > P_MIN


def test_the_chi_square_harness_rejects_a_wrong_sampler():
    # the same noise without the temperature (as if it were 1): detected
    wrong = np.zeros(ROW.size, dtype=np.int64)
    for seed in range(N_DRAWS):
        g = gumbel_noise(seed, 17, ROW.size)
        wrong[int(np.argmax(ROW.astype(np.float64) + g))] += 1
    assert chi2_test(wrong, probabilities(ROW, 0.6, 0, 1.0)) < 1e-9
    # uniform instead of Gumbel noise: detected
    wrong[:] = 0
    for seed in range(N_DRAWS):
        u = np.random.default_rng([seed, 17]).random(ROW.size)
        wrong[int(np.argmax(ROW.astype(np.float64) + u))] += 1
    assert chi2_test(wrong, probabilities(ROW, 1.0, 0, 1.0)) < 1e-9


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0)] + SETTINGS)
def test_unseeded_sampler_follows_the_same_distribution(temperature, top_k, top_p):
    s = Sampler(temperature, top_k, top_p, seed=7)
    counts = np.bincount([s(ROW) for _ in range(N_DRAWS)], minlength=ROW.size)
    if temperature == 0:
        assert counts[0] == N_DRAWS
        return
    assert chi2_test(counts, probabilities(ROW, temperature, top_k, top_p)) > P_MIN


# --- the draw is a function of (seed, position) -----------------------------------------

def test_noise_is_the_documented_function():
    for seed, position in [(0, 0), (1, 0), (0, 1), (2 ** 40 + 3, 77), (5, 10 ** 6)]:
        g = gumbel_noise(seed, position, 300)
        assert np.array_equal(g, documented_noise(seed, position, 300))
        assert np.array_equal(gumbel_noise(seed, position, 17), g[:17])  # entry j does not depend on n
    assert not np.array_equal(gumbel_noise(1, 5, 50), gumbel_noise(1, 6, 50))
    # seeded texts are reproducible only while numpy's PCG64 and SeedSequence give these
    # raw outputs (values from numpy 2.4): a change would show here first
    assert np.random.PCG64(np.random.SeedSequence([0, 0])).random_raw(3).tolist() == [
        11749869230777074271, 4976686463289251617, 755828109848996024]
    assert np.random.PCG64(np.random.SeedSequence([123, 4567])).random_raw(2).tolist() == [
        16099288346419231847, 8857858828994650051]
    assert not np.array_equal(gumbel_noise(1, 5, 50), gumbel_noise(2, 5, 50))


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_each_draw_is_the_documented_one_whatever_the_call_order(temperature, top_k, top_p):
    rows = np.random.default_rng(11).normal(0, 1.5, (40, 30)).astype(np.float32)
    want = [documented_draw(rows[i], temperature, top_k, top_p, 99, 1000 + i) for i in range(40)]
    s = SeededSampler(temperature, top_k, top_p, seed=99)
    assert [s(rows[i], 1000 + i) for i in range(40)] == want
    backwards = SeededSampler(temperature, top_k, top_p, seed=99)
    assert [backwards(rows[i], 1000 + i) for i in reversed(range(40))] == want[::-1]
    assert len(set(want)) > 5  # it did sample


def test_top_p_cut_on_large_rows_with_ties():
    # rounded logits tie often, also across the growing candidate sets the cut searches
    rng = np.random.default_rng(5)
    sizes = set()
    for trial in range(6):
        row = np.round(rng.normal(0, 0.5 + trial, 3000), 1).astype(np.float32)
        for top_k, top_p in [(0, 0.3), (0, 0.9), (700, 0.8)]:
            s = SeededSampler(1.0, top_k, top_p, seed=trial)
            ids, x = s.kept(row)
            want = processed(row, 1.0, top_k, top_p)
            assert ids.tolist() == list(want)
            assert np.allclose(x, list(want.values()), rtol=0, atol=1e-12)
            sizes.add(len(want))
            assert s(row, 9) == documented_draw(row, 1.0, top_k, top_p, trial, 9)
    assert min(sizes) < 64 < 512 < max(sizes)  # the first candidate set sufficed, and it did not


def test_greedy_ignores_seed_and_position():
    s = SeededSampler(0.0, seed=4)
    assert s(ROW, 0) == s(ROW, 123) == 0


def test_make_sampler_and_bad_settings():
    assert type(make_sampler(0.7, seed=None)) is Sampler
    assert type(make_sampler(0.7, seed=3)) is SeededSampler
    with pytest.raises(ValueError, match="seed"):
        SeededSampler(1.0, seed=-1)
    with pytest.raises(ValueError, match="seed must be an integer"):
        SeededSampler(1.0, seed="7")
    with pytest.raises(ValueError, match="temperature"):
        SeededSampler(-0.1, seed=1)
    with pytest.raises(ValueError, match="top_p"):
        SeededSampler(1.0, 0, 0.0, seed=1)
    with pytest.raises(ValueError, match="top_k"):
        SeededSampler(1.0, -2, seed=1)
    with pytest.raises(ValueError, match="position"):
        SeededSampler(1.0, seed=1)(ROW, -1)
    with pytest.raises(ValueError, match="position must be an integer"):
        SeededSampler(1.0, seed=1)(ROW, 2.5)
    with pytest.raises(ValueError, match="seed"):
        generate(FakeModel(), PROMPT, None, 4, temperature=1.0, seed=-5)
    with pytest.raises(ValueError, match="position must be >= 0"):
        gumbel_noise(1, -1, 10)
    with pytest.raises(ValueError, match="seed must be an integer"):
        gumbel_noise(1.5, 0, 10)


# --- through the speculative loop ------------------------------------------------------

LOOP_SETTINGS = [dict(temperature=0.9), dict(temperature=1.3, top_k=8), dict(temperature=1.0, top_p=0.85),
                 dict(temperature=0.7, top_k=20, top_p=0.95)]


def _recorded(drafter, n=120, **kw):
    rows = {}
    fm = FakeModel(peaked=False)
    r = generate(fm, PROMPT, drafter, n, on_logits=lambda i, row: rows.__setitem__(i, row.copy()), **kw)
    assert fm.kv == PROMPT + r.tokens.tolist()[:-1]
    return r, rows


@pytest.mark.parametrize("kw", LOOP_SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_loop_drafting_equals_plain_seeded_sampling(kw):
    plain, rows = _recorded(None, seed=2024, **kw)
    want = plain.tokens.tolist()
    assert want != reference(PROMPT, 120)  # it sampled
    # every token is the documented draw from the row that decided it, at its position
    for i, tok in enumerate(want):
        assert tok == documented_draw(rows[i], kw["temperature"], kw.get("top_k", 0), kw.get("top_p", 1.0),
                                      2024, len(PROMPT) + i)
    accepted = 0
    for drafter in (LookupDrafter(n_draft=4), LookupDrafter(n_draft=1), RejectingDrafter(5), CopyDrafter(),
                    OracleDrafter(want, n_draft=8)):
        r, _ = _recorded(drafter, seed=2024, **kw)
        assert r.tokens.tolist() == want
        accepted += r.accepted
    assert accepted > 100  # drafts were kept, not only rejected
    assert _recorded(None, seed=2025, **kw)[0].tokens.tolist() != want


def test_a_seeded_text_resumed_from_its_middle_continues_the_same():
    # positions, not the number of draws so far, key the noise: generating from the
    # prompt plus the first 30 tokens gives the remaining tokens
    kw = dict(temperature=1.0, top_k=10, seed=31)
    full = generate(FakeModel(peaked=False), PROMPT, None, 80, **kw).tokens.tolist()
    rest = generate(FakeModel(peaked=False), PROMPT + full[:30], LookupDrafter(n_draft=4), 50, **kw)
    assert rest.tokens.tolist() == full[30:]


def test_prompt_cache_and_stream_give_the_same_seeded_text():
    kw = dict(temperature=0.9, top_p=0.9, seed=8)
    want = generate(FakeModel(peaked=False), PROMPT, None, 60, **kw).tokens.tolist()
    fm, pc = FakeModel(peaked=False), PromptCache()
    generate(fm, PROMPT[:20], LookupDrafter(), 30, prompt_cache=pc, **kw)
    r = generate(fm, PROMPT, LookupDrafter(), 60, prompt_cache=pc, **kw)
    assert r.n_cached > 0 and r.tokens.tolist() == want
    st = Stream(FakeModel(peaked=False), PROMPT, RejectingDrafter(4), 60, **kw)
    assert "".join(st) == "".join(f"<{t}>" for t in want)
    assert st.result.tokens.tolist() == want


# --- a real model: SmolLM2 through llama-cpp-python ------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("llama_cpp")
    from ngramcache import llama as nl
    try:
        llm = nl.make_llama("smollm2", n_ctx=2048, n_batch=64)
    except FileNotFoundError as e:  # the model's package is not installed
        pytest.skip(str(e))
    yield llm
    llm.close()


@pytest.mark.model
@pytest.mark.parametrize("prompt,kw", [(0, dict(temperature=0.8, seed=5)),
                                       (3, dict(temperature=1.0, top_k=40, top_p=0.9, seed=6))],
                         ids=["temp", "topk-topp"])
def test_smollm2_seeded_sampling_with_drafters_equals_plain(smollm2, prompt, kw):
    from ngramcache import llama as nl

    rows = {}
    plain = nl.generate(smollm2, PROMPTS[prompt], None, 32,
                        on_logits=lambda i, row: rows.__setitem__(i, row.copy()), **kw)
    s = SeededSampler(kw["temperature"], kw.get("top_k", 0), kw.get("top_p", 1.0), seed=kw["seed"])
    assert plain.tokens.tolist() == [s(rows[i], plain.n_prompt + i) for i in range(plain.n_tokens)]
    accepted = 0
    for drafter in (LookupDrafter(n_draft=4), CopyDrafter(), SuffixDrafter()):
        r = nl.generate(smollm2, PROMPTS[prompt], drafter, 32, **kw)
        assert r.tokens.tolist() == plain.tokens.tolist(), type(drafter).__name__
        accepted += r.accepted
    assert accepted > 0
    other = nl.generate(smollm2, PROMPTS[prompt], None, 32, **{**kw, "seed": kw["seed"] + 1})
    assert other.tokens.tolist() != plain.tokens.tolist()


@pytest.mark.model
def test_cli_generate_seed_gives_the_same_text_with_or_without_drafts(smollm2, capsys):
    import json

    def text(seed, *flags):
        rc, out, err = run_cli(capsys, "generate", "-m", "smollm2", "-p", PROMPTS[3][-400:], "-n", "24",
                               "--temp", "0.9", "--top-k", "50", "--seed", seed, "--json", "--quiet", *flags)
        assert rc == 0, err
        return json.loads(out)["text"]

    want = text(77, "--no-draft")
    assert text(77, "--fixed-draft") == want
    assert text(77, "--fixed-draft", "--drafter", "suffix") == want
    assert text(78, "--no-draft") != want


def test_cli_generate_refuses_a_negative_seed(capsys):
    rc, out, err = run_cli(capsys, "generate", "-p", "hi", "--temp", "1", "--seed", "-3")
    assert rc == 2 and "--seed must be >= 0, got -3" in err
