"""The command-line skeleton: help, usage errors (exit status 2), runtime errors (exit
status 1, one line, no traceback), interrupt and closed stdout, -q and progress on
stderr, the corpus flags shared by create and stats, `python -m ngramcache` and the
console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli, run_json
from support import tiny_hf_json  # noqa: F401 (a fixture)


# --- help ------------------------------------------------------------------------------

def test_no_command_prints_help(capsys):
    rc, out, err = run_cli(capsys)
    assert rc == 2 and "create" in out and "merge" in out and "convert" in out and "info" in out


COMMAND_NAMES = ("create", "merge", "convert", "info", "stats", "generate", "demo", "serve", "chat")


@pytest.mark.parametrize("argv", [[]] + [[c] for c in COMMAND_NAMES])
def test_every_help(capsys, argv):
    rc, out, err = run_cli(capsys, *argv, "--help")
    assert rc == 0 and err == ""
    assert out.startswith("usage: ngramcache" + (f" {argv[0]}" if argv else ""))
    if argv and argv[0] != "serve":  # the output flags are declared once, for every command that prints results
        assert "--json" in out and "-q, --quiet" in out


def test_every_json_flag_is_an_output_flag_said_once():
    """--json sits in each command's "output" group, and its help is one sentence: what it
    prints instead (not "instead" twice, as a summary glued to the shared wording would be)."""
    from ngramcache.cli.main import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    with_json = []
    for name, sub in commands.items():
        for group in sub._action_groups:
            for action in group._group_actions:
                if "--json" in action.option_strings:
                    with_json.append(name)
                    assert group.title == "output", (name, group.title)
                    assert action.help.count("instead") <= 1 and action.help.count("JSON") == 1, (name, action.help)
    assert sorted(with_json) == sorted(set(commands) - {"serve"})


def test_version_is_the_installed_packages(capsys):
    import importlib.metadata
    import tomllib

    import ngramcache

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    installed = importlib.metadata.version("ngramcache")
    assert ngramcache.__version__ == installed
    assert installed == pyproject["project"]["version"], "the installed metadata is stale: reinstall (pip install -e .)"
    for flag in ("--version", "-V"):
        rc, out, err = run_cli(capsys, flag)
        assert (rc, out, err) == (0, f"ngramcache {installed}\n", "")


def test_top_help_lists_the_everyday_commands_first_one_line_each(capsys):
    from ngramcache.cli.main import EVERYDAY, build_parser

    rc, out, err = run_cli(capsys, "--help")
    assert rc == 0 and out.startswith("usage: ngramcache [-h] [-V] COMMAND ...\n")
    assert max(map(len, out.splitlines())) <= 80
    names = list(build_parser()._subparsers._group_actions[0].choices)
    listed = [line.split()[0] for line in out.splitlines()
              if line.startswith("  ") and line.split()[0] in names]
    assert sorted(listed) == sorted(names)  # every command, once
    assert listed[:len(EVERYDAY)] == list(EVERYDAY) == ["demo", "generate", "serve", "chat"]
    listing = out.split("everyday commands:\n")[1].split("\n\noptions:")[0]
    rows = [line for line in listing.splitlines() if line.startswith("  ")]
    assert len(rows) == len(names)  # no summary wrapped onto a second line
    assert all(len(row.split()) > 3 for row in rows)  # and each on its command's line


def test_one_default_model_named_with_its_reason(capsys):
    from ngramcache.cli.main import build_parser
    from ngramcache.models import DEFAULT_MODEL, DEFAULT_MODEL_REASON, DEMO_MODEL

    parser = build_parser()
    for command in ("generate", "serve", "chat"):
        args = parser.parse_args([command, "-p", "x"] if command == "generate" else [command])
        assert args.model == DEFAULT_MODEL, command
        rc, out, err = run_cli(capsys, command, "--help")
        assert f"(default: {DEFAULT_MODEL}," in out and DEFAULT_MODEL_REASON.split(",")[0] in " ".join(out.split())
    assert parser.parse_args(["demo"]).model == DEMO_MODEL
    # the model that chat needs: one with a chat template (Gemma 3 270M has none)
    assert DEFAULT_MODEL == "smollm2"


def test_stats_and_generate_help_say_what_opening_a_cache_checks(capsys):
    for command in ("stats", "generate"):
        rc, out, err = run_cli(capsys, command, "--help")
        text = " ".join(out.split())
        assert "checks its header and section bounds, not its contents" in text
        assert "'ngramcache info --verify FILE'" in text
    rc, out, err = run_cli(capsys, "stats", "--help")
    assert "--drafter lookup and --spec-draft-n-max 3, are llama-lookup-stats' own" in " ".join(out.split())


# --- errors and exit status ------------------------------------------------------------

def test_an_unusable_input_is_one_line_and_a_hint_not_the_usage(tmp_path, capsys, vectors_dir):
    short = tmp_path / "short.i32"
    np.fromfile(vectors_dir / "prose.tokens.i32", dtype="<i4")[:100].tofile(short)
    rc, out, err = run_cli(capsys, "stats", "--tokens", short, "-c", "512")
    assert (rc, out) == (2, "")
    assert err.splitlines() == [
        "ngramcache stats: error: the input has 100 tokens, too few to replay: stats needs more than one chunk "
        "of -c 512 tokens (at least 513); use a longer text or a smaller -c",
        "try 'ngramcache stats --help'"]
    # a bad flag still shows the usage
    rc, out, err = run_cli(capsys, "stats", "--tokens", short, "-c", "1")
    assert rc == 2 and err.startswith("usage: ngramcache stats ") and "-c/--ctx-size must be >= 2" in err



def test_usage_errors_exit_2(tmp_path, capsys, vectors_dir):
    toks = vectors_dir / "prose.tokens.i32"
    cases = [
        (["create", "--tokens", toks], "required: -lcs"),
        (["create", "-lcs", tmp_path / "o.bin"], "no input"),
        (["create", "-f", vectors_dir / "prose.txt", "-lcs", tmp_path / "o.bin"], "exactly one tokenizer"),
        (["create", "--tokens", toks, "-f", vectors_dir / "prose.txt", "-lcs", tmp_path / "o.bin"], "--tokens replaces"),
        (["create", "--tokens", toks, "-lcs", tmp_path / "o.xyz"], "cannot tell the output format"),
        (["create", "--tokens", toks, "-lcs", tmp_path / "o.bin", "-j", "0"], "--jobs must be at least 1"),
        (["create", "--tokens", toks, "-lcs", tmp_path / "o.bin", "--format", "csv"], "invalid choice"),
        (["merge", tmp_path / "only.bin"], "need at least one input and the output"),
        (["convert", vectors_dir / "static-small.lcs.bin"], "required: OUT"),
        (["convert", vectors_dir / "static-small.lcs.bin", vectors_dir / "static-small.lcs.bin"], "overwrite the input"),
        (["info"], "required: FILE"),
        (["nosuchcommand"], "invalid choice"),
    ]
    for argv, msg in cases:
        rc, out, err = run_cli(capsys, *argv)
        assert rc == 2, (argv, err)
        assert msg in err, (argv, err)
        assert "usage:" in err
    assert not (tmp_path / "o.bin").exists()


@pytest.mark.parametrize("argv, msg", [
    (["stats", "--tokens", "t.i32", "-c", "1"], "-c/--ctx-size must be >= 2"),
    (["generate", "-p", "x", "--spec-draft-n-max", "-1"], "--spec-draft-n-max must be 0 to 256, got -1"),
    (["generate", "-p", "x", "-c", "4"], "-c must be >= 8, got 4"),
    (["demo", "-n", "0"], "-n must be >= 1, got 0"),
    (["stats", "--tokens", "t.i32", "-m", "smollm2"], "--tokens replaces"),
    (["stats", "-f", "a.txt", "-m", "smollm2", "--tokenizer", "t.json"], "exactly one tokenizer"),
    (["stats", "-f", "a.txt", "-m", "smollm2", "-j", "0"], "-j/--jobs must be at least 1, got 0"),
    (["create", "-f", "a.txt", "-m", "smollm2", "-lcs", "o.bin", "--piece-size", "-1"],
     "--piece-size must be >= 0, got -1"),
])
def test_usage_errors_every_command(capsys, argv, msg):
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2 and out == ""
    usage, message = err.splitlines()[0], err.splitlines()[-1]
    assert usage.startswith(f"usage: ngramcache {argv[0]} ")
    assert message.startswith(f"ngramcache {argv[0]}: error: ") and msg in message, err


def test_runtime_errors_exit_1(tmp_path, capsys, vectors_dir):
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\x01\x02\x03\x04" * 5 + b"\x07\x00\x00\x00")  # key, then 7 pairs missing
    odd = tmp_path / "odd.i32"
    odd.write_bytes(b"\x01\x00\x00")
    cases = [
        (["info", tmp_path / "missing.bin"], "missing.bin: No such file or directory"),
        (["info", tmp_path], "is a directory"),
        (["info", garbage], "garbage.bin"),
        (["merge", vectors_dir / "prose.context.bin", tmp_path / "missing.bin", tmp_path / "o.bin"], "missing.bin"),
        (["merge", vectors_dir / "prose.context.bin", garbage, tmp_path / "o.bin"], "damaged or not a cache file"),
        (["convert", garbage, tmp_path / "o.bin"], "damaged or not a cache file: " + str(garbage)),
        (["create", "--tokens", tmp_path / "missing.i32", "-lcs", tmp_path / "o.bin"], "missing.i32"),
        (["create", "--tokens", odd, "-lcs", tmp_path / "o.bin"], "odd.i32: 3 bytes is not a whole number of int32"),
        (["create", "--tokens", vectors_dir / "prose.tokens.i32", "-lcs", tmp_path / "nodir" / "o.bin"],
         "does not exist"),
        (["create", "-m", tmp_path / "none.gguf", "-f", vectors_dir / "prose.txt", "-lcs", tmp_path / "o.bin"],
         "none.gguf: model file not found"),
        (["create", "-m", vectors_dir / "prose.txt", "-f", vectors_dir / "prose.txt", "-lcs", tmp_path / "o.bin"],
         "not a GGUF model file"),
        (["create", "-m", "smollm2", "-f", tmp_path / "nofile.txt", "-lcs", tmp_path / "o.bin"], "nofile.txt"),
    ]
    for argv, msg in cases:
        rc, out, err = run_cli(capsys, *argv)
        assert rc == 1, (argv, err)
        assert msg in err, (argv, err)
        assert err.startswith(f"ngramcache {argv[0]}: error: "), err
        assert "Traceback" not in err
        assert out == ""
    assert not (tmp_path / "o.bin").exists()


def test_runtime_errors_generate_demo(tmp_path, capsys):
    """Checked before any model is loaded: one line, exit status 1, no traceback."""
    (tmp_path / "empty.txt").write_bytes(b"\n")
    cases = [
        (["generate", "-m", tmp_path / "missing.gguf", "-p", "x"], 1, "missing.gguf: model file not found"),
        (["demo", "-m", tmp_path / "missing.gguf"], 1, "missing.gguf: model file not found"),
        (["generate", "-f", tmp_path / "nofile.txt"], 1, "nofile.txt: No such file or directory"),
        (["demo", "-f", tmp_path / "nofile.txt"], 1, "nofile.txt: No such file or directory"),
    ]
    for argv, code, msg in cases:
        rc, out, err = run_cli(capsys, *argv)
        assert rc == code and out == "", (argv, err)
        assert err.splitlines()[-1] == f"ngramcache {argv[0]}: error: {msg}" or msg in err.splitlines()[-1], err
        assert "Traceback" not in err
    # -f drops one trailing newline, as llama.cpp does: nothing is left, an unusable input
    rc, out, err = run_cli(capsys, "generate", "-f", tmp_path / "empty.txt")
    assert (rc, out) == (2, "")
    assert err.splitlines() == ["ngramcache generate: error: the prompt is empty", "try 'ngramcache generate --help'"]


def test_interrupt_and_broken_pipe(capsys, monkeypatch):
    from ngramcache.cli import info

    def interrupted(args):
        raise KeyboardInterrupt

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(info, "run", interrupted)
    rc, out, err = run_cli(capsys, "info", "x.bin")
    assert rc == 130 and err == "ngramcache info: interrupted\n"
    monkeypatch.setattr(info, "run", broken)
    stdout = sys.stdout
    try:
        rc, out, err = run_cli(capsys, "info", "x.bin")
        assert sys.stdout is not stdout  # later writes go nowhere instead of failing again
    finally:
        if sys.stdout is not stdout:
            sys.stdout.close()
            sys.stdout = stdout
    assert rc == 1 and err == ""


# --- shared flags ----------------------------------------------------------------------

def test_quiet_and_progress_to_stderr(vectors_dir, tmp_path, capsys, monkeypatch):
    from ngramcache.cli import create
    from ngramcache.progress import Progress
    monkeypatch.setattr(Progress, "LOG_INTERVAL", 0.0)
    monkeypatch.setattr(create, "COUNT_CHUNK", 50_000)
    rc, out, err = run_cli(capsys, "create", "--tokens", vectors_dir / "small-static.tokens.i32",
                           "-lcs", tmp_path / "o.bin")
    assert rc == 0 and "counting:" in err and "ETA" in err and "create: done" in out
    rc, out, err = run_cli(capsys, "create", "--tokens", vectors_dir / "small-static.tokens.i32",
                           "-lcs", tmp_path / "o.bin", "-q")
    assert rc == 0 and err == "" and "create: done" in out


def test_text_input_same_in_create_and_stats(vectors_dir, tmp_path, capsys, tiny_hf_json):
    """create and stats read a corpus with the same flags: several -f files (or a
    directory) tokenized one by one and concatenated; --tokenizer and --tokenizer-json
    are one flag."""
    text = (vectors_dir / "prose.txt").read_bytes()[:60_000]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes(text[:30_000])
    (corpus / "b.txt").write_bytes(text[30_000:])
    saved = tmp_path / "toks.i32"
    s = run_json(capsys, "create", "--tokenizer-json", tiny_hf_json, "-f", corpus / "a.txt", corpus / "b.txt",
                 "-lcs", tmp_path / "c.bin", "--save-tokens", saved)
    assert s["inputs"] == [str(corpus / "a.txt"), str(corpus / "b.txt")]
    toks = np.fromfile(saved, dtype="<i4")
    assert s["tokens"] == toks.size > 2_000
    replay = ["-c", "512", "--spec-draft-n-max", "4", "--json", "-q"]
    from_tokens = json.loads(run_cli(capsys, "stats", "--tokens", saved, *replay)[1])
    for flags in (["--tokenizer", tiny_hf_json, "-f", corpus / "a.txt", "-f", corpus / "b.txt"],
                  ["--tokenizer-json", tiny_hf_json, "-f", corpus]):
        rc, out, err = run_cli(capsys, "stats", *flags, *replay)
        assert rc == 0, err
        d = json.loads(out)
        assert (d["n_input"], d["n_drafted"], d["n_accept"]) == \
            (from_tokens["n_input"], from_tokens["n_drafted"], from_tokens["n_accept"])


# --- real processes --------------------------------------------------------------------

def test_python_m_ngramcache(vectors_dir, tmp_path):
    out = tmp_path / "o.bin"
    r = subprocess.run([sys.executable, "-m", "ngramcache", "create", "--tokens", str(vectors_dir / "prose.tokens.i32"),
                        "-lcs", str(out), "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["tokens"] == 60_394 and s["total_count"] == 60_392 and out.is_file()
    r = subprocess.run([sys.executable, "-m", "ngramcache", "info", str(tmp_path / "missing.bin")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "missing.bin" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "ngramcache", "merge"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2


def test_console_script():
    from importlib.metadata import entry_points
    eps = [e for e in entry_points(group="console_scripts") if e.name == "ngramcache"]
    assert eps and eps[0].value == "ngramcache.cli.main:main"
    script = Path(sys.executable).parent / "ngramcache"
    if not script.is_file():
        script = shutil.which("ngramcache")
        if script is None:
            pytest.skip("the ngramcache script is not on this environment's PATH")
    r = subprocess.run([str(script), "create", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "-lcs OUT" in r.stdout and "--no-escape" in r.stdout
