"""`ngramcache info`: llama.cpp's cache statistics for lookup.bin files, static-table headers
and --verify; damaged static tables."""

from __future__ import annotations

import pytest

from conftest import cache_stats, run_cli, run_json


@pytest.mark.parametrize("name", ["static-small.lcs.bin", "prose.context.bin", "merged.prose+dynpub.bin"])
def test_info_llama_matches_cache_stats(vectors_dir, capsys, name):
    s = run_json(capsys, "info", vectors_dir / name)
    want = cache_stats(vectors_dir)[name]
    for key in ("records", "pairs", "total_count", "max_count", "max_tokens_per_record", "records_by_ngram_size"):
        assert s[key] == want[key], key
    assert s["file_bytes"] == want["bytes"] and s["format"] == "llama"
    rc, out, _ = run_cli(capsys, "info", vectors_dir / name)
    assert rc == 0 and "llama.cpp lookup.bin" in out and f"{want['records']:,}" in out


def test_info_ngst(vectors_dir, tmp_path, capsys):
    a = tmp_path / "a.ngst"
    run_json(capsys, "convert", vectors_dir / "static-small.lcs.bin", a)
    s = run_json(capsys, "info", a, "--verify")
    assert s["format"] == "ngst" and s["keys"] == 79_343 and s["total_count"] == 248_750 and s["verified"]
    assert isinstance(s["header"], dict) and s["header"]
    rc, out, _ = run_cli(capsys, "info", a)
    assert rc == 0 and "static table" in out and "79,343" in out


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
