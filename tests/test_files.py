"""ngramcache.files: token files (raw int32 and .npy), expand_inputs (files and
directories, hidden and binary files skipped) and saving (atomic_open and every writer)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

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
    # numpy reads the header with Python's tokenizer, whose own errors must not escape
    np.save(bad, np.arange(10, dtype=np.int32))
    image = bytearray(bad.read_bytes())
    image[20:30] = b"(" * 10
    bad.write_bytes(bytes(image))
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
    assert err.value.filename == str(target) and "ngctmp" not in str(err.value)
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


# --- saving: every writer goes through atomic_open / the core's AtomicFile ----------------

def _every_save():
    """(name, save(path)) for every way the package writes a file."""
    from ngramcache.integrations.llama import store_costs
    from ngramcache.serving.engine import Memory
    from ngramcache.drafters.llama_ngram import NgramModTable

    tokens = np.arange(40, dtype=np.int32) % 7
    cache = nc.NgramCache()
    cache.update(tokens, 1, 2)
    table = nc.StaticTable.build(tokens, 2)
    store = nc.SuffixStore()
    store.add(tokens)
    return [
        ("NgramCache.save", cache.save),
        ("StaticTable.save", table.save),
        ("StaticTable.to_llama", table.to_llama),
        ("write_tokens_file", lambda p: F.write_tokens_file(p, tokens)),
        ("SuffixStore.save", store.save),
        ("NgramModTable.save", NgramModTable(64).save),
        ("Memory.save", lambda p: Memory(max_tokens=100, mod_size=64).save(p, 100, b"\0" * 32)),
        ("store_costs", lambda p: store_costs(__file__, 1, 1, [1.0, 2.0], path=os.fspath(p))),
        ("atomic_open", _write_with_atomic_open),
    ]


def _write_with_atomic_open(path, data=b"atomic_open"):
    with F.atomic_open(path) as f:
        f.write(data)


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_every_save_refuses_a_nul_byte_and_writes_nothing(tmp_path):
    for name, save in _every_save():
        with pytest.raises(ValueError, match="NUL byte|null byte"):
            save(f"{tmp_path}/victim\0other")
        assert _names(tmp_path) == [], name


def test_every_save_writes_names_of_255_bytes_and_keeps_links_and_modes(tmp_path):
    old_mask = os.umask(0o077)
    try:
        for i, (name, save) in enumerate(_every_save()):
            folder = tmp_path / str(i)
            folder.mkdir()
            long = folder / ("n" * 255)
            save(long)
            save(long)  # replacing it too
            assert long.stat().st_mode & 0o777 == 0o600, name  # 0666 less the umask
            long.chmod(0o640)
            (folder / "link").symlink_to(long.name)
            save(folder / "link")
            assert (folder / "link").is_symlink() and long.stat().st_mode & 0o777 == 0o640, name
            assert _names(folder) == ["link", "n" * 255], name
    finally:
        os.umask(old_mask)


def test_a_dangling_link_creates_its_target(tmp_path):
    (tmp_path / "link").symlink_to("made.bin")
    _write_with_atomic_open(tmp_path / "link", b"made")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "made.bin").read_bytes() == b"made"


_KILLED_WRITER = """
import os, sys, time
from ngramcache import _core
from ngramcache.files import atomic_open

path, named = sys.argv[1], sys.argv[2] == "named"
if named:  # the fallback for file systems without anonymous files
    save = _core.AtomicFile(path, named_temp=True)
    os.write(save.fd, b"x" * (8 << 20))
else:
    saving = atomic_open(path)  # held: dropping it would abort the save
    f = saving.__enter__()
    f.write(b"x" * (8 << 20))
    f.flush()
print("writing", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("temp", ["anonymous", "named"])
def test_a_writer_killed_mid_save_leaves_the_old_file_and_no_lasting_temporary(tmp_path, temp):
    target = tmp_path / "cache.bin"
    nc.NgramCache().save(target)
    old = target.read_bytes()
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(target), temp],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "writing\n"
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert target.read_bytes() == old
    left = [n for n in _names(tmp_path) if n != "cache.bin"]
    if temp == "named":
        assert len(left) == 1 and left[0].startswith(".cache.bin-") and left[0].endswith(".ngctmp")
        assert (tmp_path / left[0]).stat().st_size == 8 << 20
    nc.NgramCache().save(target)
    assert _names(tmp_path) == ["cache.bin"]


def test_saving_where_files_cannot_be_made_names_the_real_reason(tmp_path):
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    for save in (nc.NgramCache().save, _write_with_atomic_open):
        with pytest.raises(OSError) as err:
            save("/proc/x.bin")
        assert err.value.filename == "/proc/x.bin"
        assert "does not exist" not in str(err.value)
        assert "cannot create a file in /proc: " in err.value.strerror
    with pytest.raises(IsADirectoryError) as err:
        nc.NgramCache().save(tmp_path)
    assert err.value.filename == str(tmp_path)


def test_a_missing_folder_is_named_by_every_save(tmp_path):
    target = tmp_path / "no-such-folder" / "out.bin"
    for name, save in _every_save():
        if name == "store_costs":
            continue  # it makes its folder
        with pytest.raises(FileNotFoundError) as err:
            save(target)
        assert err.value.filename == str(target), name
        assert f"the folder {target.parent} does not exist" in err.value.strerror, name


def test_threads_saving_one_target_at_once_all_succeed(tmp_path):
    target = tmp_path / "shared.bin"
    versions = [bytes([65 + i]) * (50_000 + 7_000 * i) for i in range(4)]
    errors = []

    def save_many(data):
        try:
            for _ in range(15):
                _write_with_atomic_open(target, data)
        except Exception as e:  # noqa: BLE001 - collected for the assertion below
            errors.append(e)

    threads = [threading.Thread(target=save_many, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and target.read_bytes() in versions and _names(tmp_path) == ["shared.bin"]


def test_atomic_open_writes_text_and_refuses_modes_that_would_not_replace(tmp_path):
    target = tmp_path / "out.json"
    with F.atomic_open(target, "w", encoding="utf-8") as f:
        f.write("caf\u00e9")
    assert target.read_text(encoding="utf-8") == "caf\u00e9"
    for mode in ("a", "rb", "r+"):
        with pytest.raises(ValueError, match="mode must be"):
            F.atomic_open(target, mode).__enter__()
    assert _names(tmp_path) == ["out.json"]


def test_every_save_takes_a_name_that_is_not_utf8(tmp_path):
    name = os.fsdecode(b"caf\xe9.bin")  # Latin-1 bytes: a str with a surrogate escape
    for i, (what, save) in enumerate(_every_save()):
        folder = tmp_path / str(i)
        folder.mkdir()
        save(folder / name)
        assert os.listdir(os.fsencode(folder)) == [b"caf\xe9.bin"], what
