"""ngramcache.files: token files (raw int32 and .npy) and expand_inputs (files and
directories, hidden and binary files skipped)."""

from __future__ import annotations

import numpy as np
import pytest

import ngramcache as nc
from ngramcache import files as F


# --- token files -----------------------------------------------------------------------

def test_read_tokens_raw_and_npy(tmp_path):
    toks = np.array([0, 5, 2**31 - 1, 49151], dtype=np.int64)
    raw = tmp_path / "t.i32"
    toks.astype("<i4").tofile(raw)
    got = F.read_tokens_file(raw)
    assert got.dtype == np.int32 and got.tolist() == toks.tolist()
    npy = tmp_path / "t.npy"
    np.save(npy, toks)
    assert F.read_tokens_file(npy).tolist() == toks.tolist()
    # Content decides, not the name: a .npy image under another name still loads.
    other = tmp_path / "t.bin"
    other.write_bytes(npy.read_bytes())
    assert F.read_tokens_file(other).tolist() == toks.tolist()
    F.write_tokens_file(tmp_path / "w.i32", toks)
    assert (tmp_path / "w.i32").read_bytes() == raw.read_bytes()
    empty = tmp_path / "e.i32"
    empty.write_bytes(b"")
    assert F.read_tokens_file(empty).size == 0


def test_read_tokens_errors(tmp_path):
    odd = tmp_path / "odd.i32"
    odd.write_bytes(b"\x01\x00\x00\x00\x02\x00")
    with pytest.raises(ValueError, match=r"odd.i32: 6 bytes is not a whole number of int32"):
        F.read_tokens_file(odd)
    neg = tmp_path / "neg.i32"
    np.array([1, -7, 3], dtype="<i4").tofile(neg)
    with pytest.raises(ValueError, match=r"neg.i32: negative token id -7 at index 1"):
        F.read_tokens_file(neg)
    fl = tmp_path / "f.npy"
    np.save(fl, np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"f.npy: token ids must be integers"):
        F.read_tokens_file(fl)
    two = tmp_path / "2d.npy"
    np.save(two, np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(ValueError, match=r"2d.npy.*1-D"):
        F.read_tokens_file(two)
    big = tmp_path / "big.npy"
    np.save(big, np.array([1, 2**40], dtype=np.int64))
    with pytest.raises(ValueError, match=r"big.npy.*int32"):
        F.read_tokens_file(big)
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"\x93NUMPY\x01\x00garbage")
    with pytest.raises(ValueError, match=r"bad.npy: not a readable .npy"):
        F.read_tokens_file(bad)
    with pytest.raises(FileNotFoundError):
        F.read_tokens_file(tmp_path / "missing.i32")
    with pytest.raises(ValueError, match="directory"):
        F.read_tokens_file(tmp_path)


def test_read_tokens_npy_header_numpy_cannot_parse(tmp_path):
    # numpy's header parser lets the tokenizer's own error out for an unclosed bracket
    # (not a ValueError): still a damaged .npy file.
    header = b"{'descr': '<i4', 'fortran_order': False, 'shape': (3, }".ljust(117) + b"\n"
    bad = tmp_path / "unclosed.npy"
    bad.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(12))
    with pytest.raises(ValueError, match=r"unclosed.npy: not a readable .npy file \(TokenError: "):
        F.read_tokens_file(bad)


# --- inputs ----------------------------------------------------------------------------

def test_expand_inputs(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    (d / "__pycache__").mkdir()
    (d / "b.txt").write_bytes(b"b")
    (d / "a.txt").write_bytes(b"a")
    (d / "sub" / "c.txt").write_bytes(b"c")
    (d / ".hidden" / "h.txt").write_bytes(b"h")
    (d / ".dot.txt").write_bytes(b"h")
    (d / "__pycache__" / "x.pyc").write_bytes(b"\0\0")
    (d / "blob.bin").write_bytes(b"ab\0cd")
    single = tmp_path / "single.txt"
    single.write_bytes(b"s")
    files, skipped = F.expand_inputs([single, d])
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        "single.txt", "corpus/a.txt", "corpus/b.txt", "corpus/sub/c.txt"]
    assert [s.name for s in skipped] == ["blob.bin"]
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        F.expand_inputs([tmp_path / "nope.txt"])


def test_atomic_open_names_the_target_when_its_folder_is_missing(tmp_path):
    target = tmp_path / "no-such-folder" / "out.png"
    with pytest.raises(FileNotFoundError) as err:
        with F.atomic_open(target) as f:
            f.write(b"x")
    assert err.value.filename == str(target) and ".tmp" not in str(err.value)
    assert not target.parent.exists()


def test_atomic_open_replaces_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with F.atomic_open(target) as f:
            f.write(b"half")
            raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old"
    with F.atomic_open(target) as f:
        f.write(b"new")
    assert target.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_a_path_with_a_nul_byte_is_refused_not_cut_short(tmp_path):
    victim = tmp_path / "victim.bin"
    nc.NgramCache().save(victim)
    table = tmp_path / "victim.ngst"
    nc.StaticTable.build(np.arange(20, dtype=np.int32) % 5, 2).save(table)
    for call in (lambda: nc.NgramCache.load(f"{victim}\0other"),
                 lambda: nc.StaticTable.open(f"{table}\0other"),
                 lambda: nc.NgramCache().save(f"{victim}\0other")):
        with pytest.raises(ValueError, match="NUL byte"):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.bin", "victim.ngst"]
