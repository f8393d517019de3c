"""`ngramcache create`: llama-lookup-create's counts from token files, text with a model,
directories; llama.cpp's lookup.bin and the static-table output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ngramcache
from conftest import canonical_bytes, canonical_sha, cache_stats, run_cli, run_json
from ngramcache import NgramCache
from ngramcache.corpus.tokenizers import tokenize_files
from support import smollm2_path, stdlib_corpus, tiny_hf_json  # noqa: F401 (tiny_hf_json: a fixture)

def bytes_as_tokens(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)


# --- create ----------------------------------------------------------------------------

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
    from ngramcache.cli import create
    monkeypatch.setattr(create, "COUNT_CHUNK", 7)
    toks = np.random.default_rng(5).integers(0, 9, size=1000).astype("<i4")
    toks.tofile(tmp_path / "t.i32")
    run_json(capsys, "create", "--tokens", tmp_path / "t.i32", "-lcs", tmp_path / "o.bin")
    ref = NgramCache()
    ref.update(toks, 2, 2)
    assert canonical_bytes(NgramCache.load(tmp_path / "o.bin")) == canonical_bytes(ref)


def test_create_on_a_directory_of_many_binary_files_says_so_in_one_line(tmp_path, capsys, tiny_hf_json):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("one two three one two three\n")
    for i in range(50):
        (corpus / f"blob{i:02}.bin").write_bytes(b"\0binary")
    rc, _, err = run_cli(capsys, "create", "--tokenizer", tiny_hf_json, "-f", corpus,
                         "-lcs", tmp_path / "o.bin")
    assert rc == 0, err
    lines = [line for line in err.splitlines() if "binary" in line]
    assert len(lines) == 1
    assert lines[0].startswith("create: skipped 50 binary files (a NUL byte in the first 8 KiB): ")
    assert "blob00.bin, " in lines[0] and lines[0].endswith("and 47 more (--json lists them all)")


@pytest.mark.model
def test_create_stdlib_directory_with_model(tmp_path, capsys):
    corpus = stdlib_corpus(tmp_path)
    (corpus / "blob.dat").write_bytes(b"\0binary")
    out = tmp_path / "lib.bin"
    rc, stdout, err = run_cli(capsys, "create", "-m", smollm2_path(), "-f", corpus, "-lcs", out)
    assert rc == 0, err
    assert "create: skipped 1 binary file (a NUL byte in the first 8 KiB): " in err and "blob.dat" in err
    assert "create: done" in stdout and "tokens" in stdout and "peak memory" in stdout
    from ngramcache.corpus.tokenizers import load_tokenizer
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


# --- outputs ---------------------------------------------------------------------------

def _create(*argv):
    return subprocess.run([sys.executable, "-m", "ngramcache", "create", *map(str, argv)],
                          capture_output=True, text=True, timeout=120)


def test_every_output_into_a_missing_folder_fails_with_one_line(tmp_path):
    tokens = tmp_path / "t.i32"
    (np.arange(3000, dtype="<i4") % 17).tofile(tokens)
    for argv, missing in ((["--save-tokens", "nodir/t.i32", "-lcs", "out.ngst"], "nodir/t.i32"),
                          (["-lcs", "nodir/out.ngst"], "nodir/out.ngst"),
                          (["-lcs", "nodir/out.bin", "--save-tokens", "copy.i32"], "nodir/out.bin")):
        r = subprocess.run([sys.executable, "-m", "ngramcache", "create", "--tokens", str(tokens), *argv],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 1, argv
        assert r.stderr.count("\n") == 1 and missing in r.stderr and "does not exist" in r.stderr, r.stderr
        assert r.stdout == ""
        assert sorted(p.name for p in tmp_path.iterdir()) == ["t.i32"], argv


def test_save_tokens_with_tokens_writes_a_raw_copy(tmp_path):
    npy = tmp_path / "t.npy"
    np.save(npy, np.arange(3000, dtype=np.int64) % 17)
    r = _create("--tokens", npy, "--save-tokens", tmp_path / "t.i32", "-lcs", tmp_path / "o.ngst", "-q")
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.fromfile(tmp_path / "t.i32", dtype="<i4"), np.arange(3000) % 17)
    r = _create("--tokens", npy, "--save-tokens", npy, "-lcs", tmp_path / "o.ngst", "-q")
    assert r.returncode == 2 and "would overwrite the input" in r.stderr
    r = _create("--tokens", npy, "--save-tokens", tmp_path / "o.ngst", "-lcs", tmp_path / "o.ngst", "-q")
    assert r.returncode == 2 and "name the same file" in r.stderr


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc/self/mem")
def test_an_unreadable_input_is_named(tmp_path, capsys, tiny_hf_json):
    good = tmp_path / "a.txt"
    good.write_text("hello world\n")
    rc, out, err = run_cli(capsys, "create", "--tokenizer", tiny_hf_json, "-f", good, "-f", "/proc/self/mem",
                           "-lcs", tmp_path / "o.ngst")
    assert (rc, out) == (1, "")
    assert err == "ngramcache create: error: /proc/self/mem: Input/output error\n"
    assert not (tmp_path / "o.ngst").exists()
