"""Every drafter by name (ngramcache.drafters.catalog), the drafter flags of the command line, and
the replay of any drafter (stats --drafter) against the same loop run through its Python API."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ngramcache as nc
from ngramcache.drafters.catalog import DEFAULT_DRAFTER, DRAFTERS, drafter_class, make_drafter
from ngramcache.cli.main import main as cli_main
from ngramcache.drafters.base import CoreSequenceDrafter, Drafter
from ngramcache.decoding.gate import Gate, GatedDrafter
from ngramcache.replays import replay_drafter
from support import python_replay

# stats replays these with replay_drafter; lookup it replays as llama-lookup-stats (replay)
NOT_LOOKUP = [name for name in DRAFTERS if name != "lookup"]


def phrase_stream(n: int, seed: int = 0, n_phrases: int = 40, vocab: int = 500) -> np.ndarray:
    """Text-like: phrases of 5-40 tokens drawn from a small pool (so spans repeat, as in
    code and edited text), with a fresh random token between phrases now and then."""
    rng = np.random.default_rng(seed)
    pool = [rng.integers(0, vocab, rng.integers(5, 41)) for _ in range(n_phrases)]
    out, size = [], 0
    while size < n:
        piece = pool[rng.integers(0, n_phrases)] if rng.random() < 0.85 else rng.integers(0, vocab, 1)
        out.append(piece)
        size += piece.size
    return np.concatenate(out)[:n].astype(np.int32)


# --- by name ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(DRAFTERS))
def test_make_drafter_builds_the_named_class(name):
    d = make_drafter(name, n_draft=7)
    assert type(d) is drafter_class(name)
    assert isinstance(d, Drafter)
    assert d.n_draft == 7


def test_the_default_is_in_the_catalog():
    assert DEFAULT_DRAFTER in DRAFTERS


def test_map_k4v_is_map_k_with_four_values():
    assert make_drafter("map-k4v").k4v is True
    assert make_drafter("map-k").k4v is False


def test_unknown_drafter_names_the_choices():
    with pytest.raises(ValueError, match="unknown drafter 'nope'.*copy.*suffix"):
        make_drafter("nope")
    with pytest.raises(ValueError, match="unknown drafter"):
        drafter_class(3)


def test_an_option_of_another_drafter_is_a_type_error_naming_the_options():
    with pytest.raises(TypeError, match=r"'simple' takes no option max_depth \(its options: .*size_m.*size_n"):
        make_drafter("simple", max_depth=3)
    with pytest.raises(TypeError, match="k4v"):  # fixed by the name
        make_drafter("map-k", k4v=True)


def test_none_options_are_left_out():
    d = make_drafter("pld", max_ngram=None, min_ngram=None, match=None)
    assert type(d).__name__ == "PromptLookupDrafter"


def test_bad_option_values_raise_the_drafters_own_error():
    with pytest.raises(ValueError):
        make_drafter("simple", size_n=0)
    with pytest.raises(ValueError):
        make_drafter("pld", match="newest")


# --- the protocol, the same for every drafter ---------------------------------------------

@pytest.mark.parametrize("name", list(DRAFTERS))
@pytest.mark.parametrize("gated", [False, True])
def test_every_drafter_drafts_repeated_text(name, gated):
    toks = phrase_stream(3000, seed=1)
    opts = {"simple": {"size_n": 3, "size_m": 16}, "map-k": {"size_n": 3, "size_m": 16},
            "map-k4v": {"size_n": 3, "size_m": 16}, "mod": {"n_match": 4, "n_min": 2, "n_max": 16}}.get(name, {})
    d = make_drafter(name, n_draft=8, **opts)
    if gated:
        d = GatedDrafter(d, Gate([1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.7, 1.9, 2.1]))
    d.reset(toks[:200])
    pos, drafted, accepted = 200, 0, 0
    while pos < toks.size:
        p = d.propose()
        assert p.dtype == np.int32 and p.ndim == 1 and p.size <= 8
        acc = 0
        while acc < p.size and pos + acc < toks.size and p[acc] == toks[pos + acc]:
            acc += 1
        drafted += p.size
        accepted += acc
        n_new = min(acc + 1, toks.size - pos)
        d.accept(toks[pos : pos + n_new])
        pos += n_new
    assert d.stats.drafted == drafted
    assert d.stats.accepted == accepted
    assert accepted > 0.2 * (toks.size - 200) / 8, f"{name} accepted only {accepted} tokens of repeated text"
    assert np.array_equal((d.drafter if gated else d).tokens, toks)


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_propose_respects_n_max_and_rejects_bad_input(name):
    d = make_drafter(name, n_draft=8)
    d.reset(phrase_stream(500, seed=2))
    assert d.propose(0).size == 0
    assert d.propose(3).size <= 3
    with pytest.raises(ValueError):
        d.propose(-1)
    with pytest.raises((TypeError, ValueError)):
        d.accept(np.array([1.5, 2.5]))
    with pytest.raises((TypeError, ValueError)):
        d.reset("not tokens")


# --- replay in C++ == the same loop in Python ---------------------------------------------

@pytest.mark.parametrize("name", list(DRAFTERS))
def test_replay_equals_the_python_loop(name):
    toks = phrase_stream(5000, seed=3)
    opts = {"simple": {"size_n": 3, "size_m": 16}, "map-k": {"size_n": 2, "size_m": 8},
            "map-k4v": {"size_n": 2, "size_m": 8}, "mod": {"n_match": 3, "n_min": 2, "n_max": 12}}.get(name, {})
    ref = python_replay(make_drafter(name, n_draft=6, **opts), toks, 1000, 6)
    d = make_drafter(name, n_draft=6, **opts)
    st = replay_drafter(toks, d, 1000, 6)
    assert st.drafter == name
    got = {"n_drafted": st.n_drafted, "n_accept": st.n_accept, "n_steps": st.n_steps,
           "accept_length_hist": list(st.accept_length_hist)}
    assert got == ref
    assert ref["n_accept"] > 0


def test_replay_drafter_rejects_bad_arguments():
    toks = phrase_stream(3000)
    with pytest.raises(TypeError, match="needs a Drafter"):
        replay_drafter(toks, object(), 512, 8)
    with pytest.raises(ValueError, match="too short"):
        replay_drafter(toks[:100], make_drafter("pld"), 512, 8)
    with pytest.raises(ValueError, match="n_ctx"):
        replay_drafter(toks, make_drafter("pld"), 1, 8)


def test_replay_progress_errors_propagate():
    toks = phrase_stream(300_000)

    def boom(done, total):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        replay_drafter(toks, make_drafter("pld"), 4096, 8, progress=boom)


def test_every_builtin_drafter_is_compiled():
    for name in DRAFTERS:
        assert isinstance(make_drafter(name), CoreSequenceDrafter), name


# --- the command line ------------------------------------------------------------------

@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("toks") / "t.i32"
    phrase_stream(6000, seed=4).tofile(path)
    return path


@pytest.mark.parametrize("name", NOT_LOOKUP)
def test_stats_drafter_prints_what_replay_drafter_counts(token_file, capsys, name):
    rc = cli_main(["stats", "--tokens", str(token_file), "-c", "1024", "--spec-draft-n-max", "8",
                   "--drafter", name, "--json", "-q"])
    assert rc == 0
    got = json.loads(capsys.readouterr().out)
    want = replay_drafter(np.fromfile(token_file, dtype=np.int32), make_drafter(name, n_draft=8), 1024, 8)
    assert got["drafter"] == name
    for key in ("n_drafted", "n_accept", "n_steps", "n_predict"):
        assert got[key] == getattr(want, key), key


def test_stats_drafter_table_has_no_lookup_sections(token_file, capsys):
    assert cli_main(["stats", "--tokens", str(token_file), "-c", "1024", "--drafter", "suffix", "-q"]) == 0
    out = capsys.readouterr().out
    assert "drafter: suffix" in out
    assert "by source" not in out
    assert "draft position" in out


def test_stats_drafter_options_reach_the_drafter(token_file, capsys):
    base = ["stats", "--tokens", str(token_file), "-c", "1024", "--spec-draft-n-max", "8", "--drafter", "simple",
            "--json", "-q"]
    assert cli_main(base + ["--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "8"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert cli_main(base + ["--spec-ngram-simple-size-n", "6", "--spec-ngram-simple-size-m", "8"]) == 0
    large = json.loads(capsys.readouterr().out)
    want = replay_drafter(np.fromfile(token_file, dtype=np.int32),
                          make_drafter("simple", n_draft=8, size_n=2, size_m=8), 1024, 8)
    assert small["n_drafted"] == want.n_drafted
    assert small["n_drafted"] != large["n_drafted"]


@pytest.mark.parametrize("argv, message", [
    (["--drafter", "suffix", "--spec-ngram-simple-size-n", "3"], "applies to --drafter simple, not suffix"),
    (["--drafter", "simple", "--spec-ngram-simple-size-n", "0"], "--drafter simple"),
    (["--drafter", "pld", "--pld-match", "newest"], "--drafter pld"),
    (["--drafter", "nope"], "invalid choice"),
    (["--drafter", "suffix", "-lcs", "x.ngst"], "-lcs and -lcd apply to --drafter lookup"),
    (["--drafter", "lookup", "--lookup-ngram-min", "2"], "as llama-lookup-stats does"),
    (["--copy-min-match", "3"], "--copy-min-match applies to --drafter copy, not lookup"),
    (["--drafter", "copy", "--copy-min-match", "5", "--copy-max-match", "4"],
     "--drafter copy: --copy-min-match must be <= max_match (max_match=4), got 5"),
])
def test_stats_drafter_usage_errors(token_file, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        rc = cli_main(["stats", "--tokens", str(token_file), "-c", "1024", "-q"] + argv)
        raise SystemExit(rc)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_stats_default_is_lookup(token_file, capsys):
    assert cli_main(["stats", "--tokens", str(token_file), "-c", "1024", "--json", "-q"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = nc.replay(np.fromfile(token_file, dtype=np.int32), 1024, 3)  # llama.cpp's default draft length
    assert got["drafter"] == "lookup"
    assert got["n_drafted"] == want.n_drafted
