"""The cache commands end to end: create, merge, convert, info (in-process through
ngramcache.cli.main, plus real subprocesses for `python -m ngramcache` and the script)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import ngramcache
from ngramcache import NgramCache
from ngramcache.cli import main
from ngramcache.tokenizers import tokenize_files

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
HAVE_STATIC = hasattr(ngramcache, "StaticTable")
needs_static = pytest.mark.skipif(not HAVE_STATIC, reason="StaticTable not in this build yet")


# -- helpers ----------------------------------------------------------------------------

def canonical_bytes(cache: NgramCache) -> bytes:
    """cache-stats.jsonl's canonical form: records sorted by key (signed int32 slots,
    lexicographic), pairs by token, written in the lookup.bin layout."""
    keys, offsets, toks, cnts = cache.arrays()
    offsets = offsets.astype(np.int64)
    n = np.diff(offsets)
    order = np.lexsort((keys[:, 3], keys[:, 2], keys[:, 1], keys[:, 0]))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    # Entries in (record rank, token) order.
    rec_of_entry = np.repeat(np.arange(keys.shape[0]), n)
    eorder = np.lexsort((toks, rank[rec_of_entry]))
    n_sorted = n[order]
    out = np.empty(int((5 * order.size) + 2 * n.sum()), dtype="<i4")
    starts = np.concatenate([[0], np.cumsum(5 + 2 * n_sorted)[:-1]]).astype(np.int64)
    for j in range(4):
        out[starts + j] = keys[order, j]
    out[starts + 4] = n_sorted
    # Position of each sorted entry: its record's start + 5 + 2 * (index within the record).
    rec_sorted = np.repeat(np.arange(order.size), n_sorted)
    first = np.concatenate([[0], np.cumsum(n_sorted)[:-1]]).astype(np.int64)
    within = np.arange(eorder.size) - first[rec_sorted]
    pos = starts[rec_sorted] + 5 + 2 * within
    out[pos] = toks[eorder]
    out[pos + 1] = cnts[eorder]
    return out.tobytes()


def canonical_sha(path) -> str:
    return hashlib.sha256(canonical_bytes(NgramCache.load(path))).hexdigest()


def cache_stats(vectors_dir: Path) -> dict:
    rows = [json.loads(line) for line in (vectors_dir / "cache-stats.jsonl").read_text().splitlines() if line.strip()]
    return {r["file"]: r for r in rows}


def run_cli(capsys, *argv):
    """main(argv) -> (exit code, stdout, stderr); argparse's own exits count as codes."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv) -> dict:
    rc, out, err = run_cli(capsys, *argv, "--json", "--quiet")
    assert rc == 0, err
    assert err == ""
    return json.loads(out)


def stdlib_corpus(tmp_path: Path, limit: int = 300_000) -> Path:
    """A small real corpus: a slice of the standard library's source, as a directory."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    d = tmp_path / "corpus"
    d.mkdir()
    total = 0
    for i, name in enumerate(["functools.py", "csv.py", "shutil.py", "tempfile.py", "enum.py", "inspect.py"]):
        src = lib / name
        if not src.is_file():
            continue
        data = src.read_bytes()
        (d / f"{i:02d}_{name}").write_bytes(data)
        total += len(data)
        if total >= limit:
            break
    return d


def smollm2_path() -> str:
    if not HAVE_LLAMA:
        pytest.skip("llama-cpp-python not installed")
    from ngramcache.models import default_model_path
    try:
        return default_model_path("smollm2")
    except FileNotFoundError as e:
        pytest.skip(str(e))


def bytes_as_tokens(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)


# -- create ------------------------------------------------------------------------------

def test_create_from_vector_tokens_equals_llama_lookup_create(vectors_dir, tmp_path, capsys):
    """--tokens small-static.tokens.i32 must hold exactly llama-lookup-create's counts."""
    out = tmp_path / "static.bin"
    s = run_json(capsys, "create", "--tokens", vectors_dir / "small-static.tokens.i32", "-lcs", out)
    want = cache_stats(vectors_dir)["static-small.lcs.bin"]
    assert s["tokens"] == 248_752 and s["keys"] == want["records"] and s["entries"] == want["pairs"]
    assert s["total_count"] == want["total_count"] == 248_750
    assert s["format"] == "llama" and s["file_bytes"] == out.stat().st_size == want["bytes"]
    assert canonical_sha(out) == want["sha256_canonical"]
    for key in ("seconds", "peak_rss_bytes", "stage_seconds"):
        assert key in s


@pytest.mark.model
def test_create_with_model_equals_llama_lookup_create(vectors_dir, tmp_path, capsys):
    out = tmp_path / "static.bin"
    s = run_json(capsys, "create", "-m", smollm2_path(), "-f", vectors_dir / "small-static.txt",
                 "-lcs", out, "--format", "llama", "--save-tokens", tmp_path / "toks.i32")
    assert s["tokens"] == 248_752
    assert canonical_sha(out) == cache_stats(vectors_dir)["static-small.lcs.bin"]["sha256_canonical"]
    assert canonical_bytes(NgramCache.load(out)) == canonical_bytes(NgramCache.load(vectors_dir / "static-small.lcs.bin"))
    assert (tmp_path / "toks.i32").read_bytes() == (vectors_dir / "small-static.tokens.i32").read_bytes()
    # One tokenizer call per file gives the same (llama.cpp's own way).
    out0 = tmp_path / "static0.bin"
    run_json(capsys, "create", "-m", "smollm2", "-f", vectors_dir / "small-static.txt", "-lcs", out0,
             "--piece-size", "0", "-j", "1")
    assert canonical_bytes(NgramCache.load(out0)) == canonical_bytes(NgramCache.load(out))


def test_create_stdlib_slice_with_tokens(tmp_path, capsys):
    corpus = stdlib_corpus(tmp_path)
    data = b"".join(p.read_bytes() for p in sorted(corpus.iterdir()))
    toks = bytes_as_tokens(data)
    np.save(tmp_path / "toks.npy", toks.astype(np.int64))
    toks.astype("<i4").tofile(tmp_path / "toks.i32")
    ref = NgramCache()
    ref.update(toks, 2, 2)
    for src in ("toks.npy", "toks.i32"):
        out = tmp_path / f"{src}.bin"
        s = run_json(capsys, "create", "--tokens", tmp_path / src, "-lcs", out)
        assert s["tokens"] == toks.size and s["keys"] == len(ref)
        assert canonical_bytes(NgramCache.load(out)) == canonical_bytes(ref)


def test_create_counts_in_chunks_like_one_update(tmp_path, capsys, monkeypatch):
    """Counting runs in chunks (for the progress bar): the chunk seams must not lose or
    double any 2-gram."""
    from ngramcache.commands import create
    monkeypatch.setattr(create, "COUNT_CHUNK", 7)
    toks = np.random.default_rng(5).integers(0, 9, size=1000).astype("<i4")
    toks.tofile(tmp_path / "t.i32")
    run_json(capsys, "create", "--tokens", tmp_path / "t.i32", "-lcs", tmp_path / "o.bin")
    ref = NgramCache()
    ref.update(toks, 2, 2)
    assert canonical_bytes(NgramCache.load(tmp_path / "o.bin")) == canonical_bytes(ref)


@pytest.mark.model
def test_create_stdlib_directory_with_model(tmp_path, capsys):
    corpus = stdlib_corpus(tmp_path)
    (corpus / "blob.dat").write_bytes(b"\0binary")
    out = tmp_path / "lib.bin"
    rc, stdout, err = run_cli(capsys, "create", "-m", smollm2_path(), "-f", corpus, "-lcs", out)
    assert rc == 0, err
    assert "skipping binary file" in err and "blob.dat" in err
    assert "create: done" in stdout and "tokens" in stdout and "peak memory" in stdout
    from ngramcache.tokenizers import load_tokenizer
    toks = tokenize_files(sorted(p for p in corpus.iterdir() if p.suffix == ".py"), load_tokenizer("smollm2"), jobs=1)
    ref = NgramCache()
    ref.update(toks, 2, 2)
    assert canonical_bytes(NgramCache.load(out)) == canonical_bytes(ref)


@pytest.mark.model
def test_create_invalid_text_names_file_and_offset(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc \\xF4\\x90\\x80\\x80 def\n")
    rc, out, err = run_cli(capsys, "create", "-m", smollm2_path(), "-f", bad, "-lcs", tmp_path / "o.bin")
    assert rc == 1 and out == ""
    assert f"{bad}: byte offset 4:" in err and "U+110000" in err
    assert not (tmp_path / "o.bin").exists()
    assert run_cli(capsys, "create", "-m", "smollm2", "-f", bad, "-lcs", tmp_path / "o.bin", "--no-escape")[0] == 0


@needs_static
def test_create_ngst_matches_llama_counts(vectors_dir, tmp_path, capsys):
    out = tmp_path / "static.ngst"
    s = run_json(capsys, "create", "--tokens", vectors_dir / "small-static.tokens.i32", "-lcs", out)
    assert s["format"] == "ngst" and s["keys"] == 79_343 and s["total_count"] == 248_750
    table = ngramcache.StaticTable.open(out)
    ref = NgramCache.load(vectors_dir / "static-small.lcs.bin")
    for key, part in list(ref.items())[:2000]:
        assert table.get(key) == part
    # Exporting gives back llama.cpp's counts exactly.
    rc, _, err = run_cli(capsys, "convert", out, tmp_path / "back.bin", "-q")
    assert rc == 0, err
    assert canonical_sha(tmp_path / "back.bin") == cache_stats(vectors_dir)["static-small.lcs.bin"]["sha256_canonical"]


# -- merge, convert, info ---------------------------------------------------------------

def test_merge_equals_llama_lookup_merge(vectors_dir, tmp_path, capsys):
    out = tmp_path / "merged.bin"
    s = run_json(capsys, "merge", vectors_dir / "prose.context.bin", vectors_dir / "dynpub.context.bin", out)
    want = cache_stats(vectors_dir)["merged.prose+dynpub.bin"]
    assert s["keys"] == want["records"] and s["entries"] == want["pairs"] and s["total_count"] == want["total_count"]
    assert s["input_formats"] == ["llama", "llama"]
    assert canonical_sha(out) == want["sha256_canonical"]


def test_merge_single_input_is_a_copy(vectors_dir, tmp_path, capsys):
    out = tmp_path / "copy.lcd"
    run_json(capsys, "merge", vectors_dir / "static-small.lcs.bin", out)
    assert canonical_sha(out) == cache_stats(vectors_dir)["static-small.lcs.bin"]["sha256_canonical"]


@needs_static
def test_merge_mixed_formats(vectors_dir, tmp_path, capsys):
    ngst = tmp_path / "static.ngst"
    run_json(capsys, "convert", vectors_dir / "static-small.lcs.bin", ngst)
    assert ngst.read_bytes()[:4] == b"NGST"
    # ngst + llama -> llama: the same as summing the two llama files.
    run_json(capsys, "merge", ngst, vectors_dir / "static-small.lcs.bin", tmp_path / "twice.bin")
    ref = NgramCache.load(vectors_dir / "static-small.lcs.bin")
    ref.merge(NgramCache.load(vectors_dir / "static-small.lcs.bin"))
    assert canonical_bytes(NgramCache.load(tmp_path / "twice.bin")) == canonical_bytes(ref)
    # ... and -> ngst.
    s = run_json(capsys, "merge", vectors_dir / "static-small.lcs.bin", ngst, tmp_path / "twice.ngst")
    assert s["format"] == "ngst" and s["total_count"] == 2 * 248_750
    run_json(capsys, "convert", tmp_path / "twice.ngst", tmp_path / "twice2.bin")
    assert canonical_bytes(NgramCache.load(tmp_path / "twice2.bin")) == canonical_bytes(ref)


@needs_static
def test_context_caches_and_static_tables(vectors_dir, tmp_path, capsys):
    """A static table holds one n-gram size: a context cache (sizes 1-4) needs --ngram-size."""
    ctx = vectors_dir / "prose.context.bin"
    rc, out, err = run_cli(capsys, "merge", ctx, vectors_dir / "dynpub.context.bin", tmp_path / "m.ngst")
    assert rc == 1 and "sizes 1, 2, 3, 4" in err and not (tmp_path / "m.ngst").exists()
    rc, out, err = run_cli(capsys, "convert", ctx, tmp_path / "c.ngst")
    assert rc == 1 and "prose.context.bin" in err
    s = run_json(capsys, "convert", "--ngram-size", "3", ctx, tmp_path / "c3.ngst")
    ref = NgramCache.load(ctx)
    want = {k: p for k, p in ref.items() if len(k) == 3}
    assert s["keys"] == len(want) == 45_205
    table = ngramcache.StaticTable.open(tmp_path / "c3.ngst")
    assert table.ngram_size == 3 and all(table.get(k) == p for k, p in list(want.items())[:3000])
    rc, out, err = run_cli(capsys, "convert", "--ngram-size", "3", ctx, tmp_path / "c3.bin")
    assert rc == 2 and "--ngram-size applies only" in err


def test_convert_llama_to_llama(vectors_dir, tmp_path, capsys):
    s = run_json(capsys, "convert", vectors_dir / "static-small.lcs.bin", tmp_path / "same.bin")
    assert s["input_format"] == "llama" and s["format"] == "llama"
    assert canonical_sha(tmp_path / "same.bin") == cache_stats(vectors_dir)["static-small.lcs.bin"]["sha256_canonical"]


@needs_static
def test_convert_round_trip(vectors_dir, tmp_path, capsys):
    a, b = tmp_path / "a.ngst", tmp_path / "b.bin"
    s1 = run_json(capsys, "convert", vectors_dir / "static-small.lcs.bin", a)
    s2 = run_json(capsys, "convert", a, b)
    assert s1["input_format"] == "llama" and s1["format"] == "ngst"
    assert s2["input_format"] == "ngst" and s2["format"] == "llama"
    assert s1["keys"] == s2["keys"] == 79_343
    assert canonical_sha(b) == cache_stats(vectors_dir)["static-small.lcs.bin"]["sha256_canonical"]
    # --format overrides the extension.
    run_json(capsys, "convert", a, tmp_path / "c.dat", "--format", "ngst")
    assert (tmp_path / "c.dat").read_bytes()[:4] == b"NGST"


@pytest.mark.parametrize("name", ["static-small.lcs.bin", "prose.context.bin", "merged.prose+dynpub.bin"])
def test_info_llama_matches_cache_stats(vectors_dir, capsys, name):
    s = run_json(capsys, "info", vectors_dir / name)
    want = cache_stats(vectors_dir)[name]
    for key in ("records", "pairs", "total_count", "max_count", "max_tokens_per_record", "records_by_ngram_size"):
        assert s[key] == want[key], key
    assert s["file_bytes"] == want["bytes"] and s["format"] == "llama"
    rc, out, _ = run_cli(capsys, "info", vectors_dir / name)
    assert rc == 0 and "llama.cpp lookup.bin" in out and f"{want['records']:,}" in out


@needs_static
def test_info_ngst(vectors_dir, tmp_path, capsys):
    a = tmp_path / "a.ngst"
    run_json(capsys, "convert", vectors_dir / "static-small.lcs.bin", a)
    s = run_json(capsys, "info", a, "--verify")
    assert s["format"] == "ngst" and s["keys"] == 79_343 and s["total_count"] == 248_750 and s["verified"]
    assert isinstance(s["header"], dict) and s["header"]
    rc, out, _ = run_cli(capsys, "info", a)
    assert rc == 0 and "static table" in out and "79,343" in out


# -- errors and exit codes ----------------------------------------------------------------

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


def test_no_command_prints_help(capsys):
    rc, out, err = run_cli(capsys)
    assert rc == 2 and "create" in out and "merge" in out and "convert" in out and "info" in out


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


@needs_static
def test_damaged_ngst_is_a_clear_error(vectors_dir, tmp_path, capsys):
    a = tmp_path / "a.ngst"
    run_json(capsys, "convert", vectors_dir / "static-small.lcs.bin", a)
    data = bytearray(a.read_bytes())
    (tmp_path / "trunc.ngst").write_bytes(bytes(data[: len(data) // 2]))
    (tmp_path / "empty.ngst").write_bytes(b"")
    for bad in ("trunc.ngst", "empty.ngst"):
        for cmd in (["info"], ["convert"]):
            argv = cmd + [tmp_path / bad] + ([tmp_path / "out.bin"] if cmd == ["convert"] else [])
            rc, out, err = run_cli(capsys, *argv)
            assert rc == 1 and "damaged or not a cache file" in err and bad in err, err


def test_quiet_and_progress_to_stderr(vectors_dir, tmp_path, capsys, monkeypatch):
    from ngramcache.commands import create
    from ngramcache.progress import Progress
    monkeypatch.setattr(Progress, "LOG_INTERVAL", 0.0)
    monkeypatch.setattr(create, "COUNT_CHUNK", 50_000)
    rc, out, err = run_cli(capsys, "create", "--tokens", vectors_dir / "small-static.tokens.i32",
                           "-lcs", tmp_path / "o.bin")
    assert rc == 0 and "counting:" in err and "ETA" in err and "create: done" in out
    rc, out, err = run_cli(capsys, "create", "--tokens", vectors_dir / "small-static.tokens.i32",
                           "-lcs", tmp_path / "o.bin", "-q")
    assert rc == 0 and err == "" and "create: done" in out


# -- real processes -----------------------------------------------------------------------

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
    assert eps and eps[0].value == "ngramcache.cli:main"
    script = Path(sys.executable).parent / "ngramcache"
    if not script.is_file():
        script = shutil.which("ngramcache")
        if script is None:
            pytest.skip("the ngramcache script is not on this environment's PATH")
    r = subprocess.run([str(script), "create", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "-lcs OUT" in r.stdout and "--no-escape" in r.stdout


# -- one skeleton: help, the error path, shared flags ---------------------------------------

COMMAND_NAMES = ("create", "merge", "convert", "info", "stats", "generate", "demo")


@pytest.mark.parametrize("argv", [[]] + [[c] for c in COMMAND_NAMES])
def test_every_help(capsys, argv):
    rc, out, err = run_cli(capsys, *argv, "--help")
    assert rc == 0 and err == ""
    assert out.startswith("usage: ngramcache" + (f" {argv[0]}" if argv else ""))
    if argv:  # the output flags are declared once, for every command
        assert "--json" in out and "-q, --quiet" in out


@pytest.mark.parametrize("argv, msg", [
    (["stats", "--tokens", "t.i32", "-c", "1"], "-c/--ctx-size must be >= 2"),
    (["generate", "-p", "x", "--spec-draft-n-max", "-1"], "--spec-draft-n-max must be >= 0, got -1"),
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


def test_runtime_errors_generate_demo(tmp_path, capsys):
    """Checked before any model is loaded: one line, exit status 1, no traceback."""
    (tmp_path / "empty.txt").write_bytes(b"\n")
    cases = [
        (["generate", "-m", tmp_path / "missing.gguf", "-p", "x"], 1, "missing.gguf: model file not found"),
        (["demo", "-m", tmp_path / "missing.gguf"], 1, "missing.gguf: model file not found"),
        (["generate", "-f", tmp_path / "nofile.txt"], 1, "nofile.txt: No such file or directory"),
        (["demo", "-f", tmp_path / "nofile.txt"], 1, "nofile.txt: No such file or directory"),
        # -f drops one trailing newline, as llama.cpp does: nothing is left
        (["generate", "-f", tmp_path / "empty.txt"], 2, "the prompt is empty"),
    ]
    for argv, code, msg in cases:
        rc, out, err = run_cli(capsys, *argv)
        assert rc == code and out == "", (argv, err)
        assert err.splitlines()[-1] == f"ngramcache {argv[0]}: error: {msg}" or msg in err.splitlines()[-1], err
        assert "Traceback" not in err


def test_interrupt_and_broken_pipe(capsys, monkeypatch):
    from ngramcache.commands import info

    def interrupted(args):
        raise KeyboardInterrupt

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(info, "run", interrupted)
    rc, out, err = run_cli(capsys, "info", "x.bin")
    assert rc == 130 and err == "interrupted\n"
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


@pytest.fixture(scope="module")
def tiny_hf_json(tmp_path_factory):
    """A small byte-level BPE tokenizer.json, trained on the reference prose."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    text = (Path(__file__).resolve().parents[1].parent / "shared" / "vectors" / "prose.txt").read_text()
    tok.train_from_iterator([text[:50_000]], trainer=trainer)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tok.save(str(path))
    return path


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


# -- prompts: llama.cpp's -p and -f rules in generate and demo -----------------------------

PROMPT_CASES = [
    # (flags, file content or None, the prompt the model must see)
    (["-p", "say\\tthis\\n"], None, b"say\tthis\n"),
    (["-p", "say\\tthis\\n", "--no-escape"], None, b"say\\tthis\\n"),
    (["-p", "two lines\n"], None, b"two lines\n"),  # -p keeps a trailing newline
    (["-f"], b"col\\x41\\tend\n", b"colA\tend"),  # one trailing newline dropped, escapes processed
    (["-f", "--no-escape"], b"col\\x41\\tend\n\n", b"col\\x41\\tend\n"),
]


def _prompt_argv(tmp_path, flags, content):
    if content is None:
        return list(flags)
    f = tmp_path / "prompt.txt"
    f.write_bytes(content)
    return ["-f", f] + flags[1:]


class _FakeBackend:
    def piece(self, tok):
        return b"<%d>" % tok

    def tokenize(self, prompt):
        return np.frombuffer(prompt, dtype=np.uint8).astype(np.int32)


def _fake_result(prompt, text="<7><8>"):
    from types import SimpleNamespace
    return SimpleNamespace(n_prompt=len(prompt), t_prompt=0.01, n_tokens=2, t_total=0.05, drafted=1, accepted=1,
                           t_draft=1e-4, t_verify=0.03, steps=1, stop_reason="length", text=text,
                           tokens=np.array([7, 8], dtype=np.int32), gen_tokens_per_s=50.0, e2e_tokens_per_s=40.0)


@pytest.fixture
def fake_llama(monkeypatch, tmp_path):
    """ngramcache.llama with a fake model: records every prompt given to generate."""
    from types import ModuleType, SimpleNamespace
    from ngramcache import llama as nl
    seen = []

    def generate(llm, prompt, drafter=None, max_tokens=128, on_tokens=None, **kw):
        seen.append(prompt)
        if on_tokens is not None:
            on_tokens([7, 8], 1)
        return _fake_result(prompt)

    def generate_llama_cpp(llm, prompt, max_tokens=128):
        seen.append(prompt)
        return _fake_result(prompt)

    monkeypatch.setattr(nl, "make_llama", lambda *a, **k: object())
    monkeypatch.setattr(nl.LlamaBackend, "of", classmethod(lambda cls, llm: _FakeBackend()))
    monkeypatch.setattr(nl, "generate", generate)
    monkeypatch.setattr(nl, "generate_llama_cpp", generate_llama_cpp)
    monkeypatch.setattr(nl, "CountingDraftModel", lambda inner: inner)
    monkeypatch.setattr(nl, "adaptive_drafter", lambda llm, **k: SimpleNamespace(gate=SimpleNamespace(costs=[1.0, 1.5])))
    spec = ModuleType("llama_cpp.llama_speculative")
    spec.LlamaPromptLookupDecoding = lambda: object()
    if importlib.util.find_spec("llama_cpp") is None:
        monkeypatch.setitem(sys.modules, "llama_cpp", ModuleType("llama_cpp"))
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", spec)
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"GGUF")
    return seen, model


@pytest.mark.parametrize("flags, content, want", PROMPT_CASES)
def test_generate_prompt_rules(tmp_path, capsys, fake_llama, flags, content, want):
    seen, model = fake_llama
    rc, out, err = run_cli(capsys, "generate", "-m", model, "--no-draft", *_prompt_argv(tmp_path, flags, content))
    assert rc == 0, err
    assert seen == [want]
    # llama-lookup's layout: the prompt, the text (draft tokens first), then the block on stderr
    assert out == "\n\n" + want.decode() + "<7><8>\n\n"
    assert "n_accept     = 1\naccept       = 100.000%\n" in err and err.startswith("encoded ")


@pytest.mark.parametrize("flags, content, want", PROMPT_CASES)
def test_demo_prompt_rules(tmp_path, capsys, fake_llama, flags, content, want):
    seen, model = fake_llama
    rc, out, err = run_cli(capsys, "demo", "-m", model, "--repeats", "1", "-n", "8", "-q",
                           *_prompt_argv(tmp_path, flags, content))
    assert rc == 0, err
    assert err == ""  # -q: no progress lines
    warm, runs = seen[:2], seen[2:]
    assert warm == [want[:200]] * 2 and runs == [want] * 3  # plain, llama-cpp, ngramcache
    lines = out.splitlines()
    assert lines[0] == "" and lines[1].split() == ["method", "gen", "tok/s", "speedup", "e2e", "tok/s", "e2e",
                                                   "speedup", "prompt", "s", "drafted", "accepted", "accept", "%",
                                                   "identical"]
    assert [ln.split()[0] for ln in lines[3:6]] == ["plain", "llama-cpp", "ngramcache"]
    assert all(ln.split()[-1] == "yes" for ln in lines[3:6])
    assert "ngramcache's output (1 lines; first 1):" in out
