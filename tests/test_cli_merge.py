"""`ngramcache merge`: llama-lookup-merge's sums, one input as a copy, mixed lookup.bin and
static-table inputs and outputs."""

from __future__ import annotations

from conftest import canonical_bytes, canonical_sha, cache_stats, run_json
from ngramcache import NgramCache


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


def test_merge_count_overflow_is_a_one_line_error(tmp_path, capsys):
    import struct

    from ngramcache.cli.main import main

    near_max = tmp_path / "near_max.bin"  # one pair counted 2^31 - 1 times: twice is past int32
    near_max.write_bytes(struct.pack("<4ii2i", 1, 2, -1, -1, 1, 5, 2**31 - 1))
    assert main(["merge", str(near_max), str(near_max), str(tmp_path / "out.bin")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ngramcache merge: error: ") and "count exceeds the int32 range" in err
    assert err.count("\n") == 1
    assert not (tmp_path / "out.bin").exists()
