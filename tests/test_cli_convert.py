"""`ngramcache convert`: lookup.bin and static tables both ways, --format, --ngram-size for
caches that hold several n-gram sizes."""

from __future__ import annotations

import ngramcache
from conftest import cache_stats, canonical_sha, run_cli, run_json
from ngramcache import NgramCache


def test_convert_llama_to_llama(vectors_dir, tmp_path, capsys):
    s = run_json(capsys, "convert", vectors_dir / "static-small.lcs.bin", tmp_path / "same.bin")
    assert s["input_format"] == "llama" and s["format"] == "llama"
    assert canonical_sha(tmp_path / "same.bin") == cache_stats(vectors_dir)["static-small.lcs.bin"]["sha256_canonical"]


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


def test_a_damaged_table_is_not_copied(tmp_path, capsys):
    """Converting checks the whole table, not only the header that opening checks."""
    import numpy as np
    good, copy = tmp_path / "good.ngst", tmp_path / "copy.ngst"
    ngramcache.StaticTable.build(np.random.default_rng(0).integers(0, 1000, 5000), 2).save(good)
    image = bytearray(good.read_bytes())
    image[5000] ^= 1
    damaged = tmp_path / "damaged.ngst"
    damaged.write_bytes(bytes(image))
    assert run_cli(capsys, "convert", good, copy)[0] == 0
    copy.unlink()
    rc, out, err = run_cli(capsys, "convert", damaged, copy)
    assert rc == 1 and "damaged.ngst" in err and "checksum" in err
    assert len(err.strip().splitlines()) == 1
    assert not copy.exists()
