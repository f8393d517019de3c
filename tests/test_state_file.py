"""The one reader and writer of the small state files (ngramcache._state_file): what it
writes, byte for byte; every refusal, with its message; the three formats on it keep
their bytes on disk."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from ngramcache import CacheFormatError
from ngramcache._state_file import StateFileError, StateFormat, VocabularyMismatchError

FMT = StateFormat(b"TEST", 3, "<QI", "a test state")


def _payload_size(fields):
    return 4 * fields[0]


def test_write_is_magic_version_fields_payload_crc(tmp_path):
    path = tmp_path / "s.bin"
    words = np.arange(5, dtype="<i4")
    FMT.write(path, (5, 77), (words[:2], words[2:].tobytes()))
    data = path.read_bytes()
    body = b"TEST" + struct.pack("<IQI", 3, 5, 77) + words.tobytes()
    assert data == body + struct.pack("<I", zlib.crc32(body))
    fields, payload = FMT.read(path, _payload_size)
    assert fields == (5, 77)
    assert np.array_equal(np.frombuffer(payload, dtype="<i4"), words)


def _refusal(tmp_path, data: bytes, payload_size=_payload_size) -> str:
    path = tmp_path / "bad.bin"
    path.write_bytes(data)
    with pytest.raises(StateFileError) as e:
        FMT.read(path, payload_size)
    assert isinstance(e.value, CacheFormatError)
    assert str(e.value).startswith(f"{path}: ")
    return str(e.value)


def test_every_refusal_names_the_file_and_the_problem(tmp_path):
    path = tmp_path / "good.bin"
    FMT.write(path, (3, 0), (np.arange(3, dtype="<i4"),))
    good = path.read_bytes()
    assert "damaged or not a test state file (truncated: 10 bytes)" in _refusal(tmp_path, good[:10])
    assert "(truncated: 0 bytes)" in _refusal(tmp_path, b"")
    assert "(5 bytes, no TEST magic)" in _refusal(tmp_path, b"hello")
    assert "(magic b'XEST', expected b'TEST')" in _refusal(tmp_path, b"X" + good[1:])
    # another version is not damage: say which
    body = bytearray(good[:-4])
    body[4:8] = struct.pack("<I", 9)
    fixed = bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))
    assert "a test state file of version 9; this ngramcache reads version 3" in _refusal(tmp_path, fixed)
    assert "(32 bytes do not hold the 36 its header promises: truncated?)" in _refusal(tmp_path, good[:-4])
    assert "(checksum mismatch)" in _refusal(tmp_path, good[:20] + bytes([good[20] ^ 1]) + good[21:])
    # a payload whose size the header does not fix: the checksum still covers it
    assert "(checksum mismatch)" in _refusal(tmp_path, good[:-5] + good[-4:], payload_size=None)
    with pytest.raises(FileNotFoundError):
        FMT.read(tmp_path / "missing.bin", _payload_size)


def test_another_vocabulary_is_its_own_error():
    FMT.check_vocabulary("f.bin", (100, b"a" * 32), (100, b"a" * 32))
    for other in [(101, b"a" * 32), (100, b"b" * 32)]:
        with pytest.raises(VocabularyMismatchError, match=r"^f\.bin: a test state made for another vocabulary"):
            FMT.check_vocabulary("f.bin", other, (100, b"a" * 32))


def test_the_three_formats_keep_their_bytes(tmp_path):
    """NGMT, NGSS and NGSRVMEM as they were written before the helper existed."""
    from ngramcache.drafters.llama_ngram import NgramModDrafter, NgramModTable
    from ngramcache.drafters.suffix import SuffixStore
    from ngramcache.serving.memory import Memory

    def with_crc(body):
        return body + struct.pack("<I", zlib.crc32(body))

    table = NgramModTable(64)
    NgramModDrafter(table=table).reset(np.arange(100, dtype=np.int32) % 13)
    table.save(tmp_path / "m")
    slots = table.entries().astype("<i4")
    assert (tmp_path / "m").read_bytes() == with_crc(struct.pack("<4sIQ", b"NGMT", 1, 64) + slots.tobytes())

    reqs = [np.arange(10, dtype=np.int32), np.arange(5, dtype=np.int32) + 3]
    store = SuffixStore(max_tokens=1000)
    for r in reqs:
        store.add(r)
    store.save(tmp_path / "s")
    body = (struct.pack("<4sIQIIQ", b"NGSS", 1, 1000, store.max_depth, 0, 2) + struct.pack("<QQ", 10, 5)
            + b"".join(r.astype("<i4").tobytes() for r in reqs))
    assert (tmp_path / "s").read_bytes() == with_crc(body)

    mem = Memory(max_tokens=1000, mod_size=64)
    for r in reqs:
        mem.learn(r)
    fp = bytes(range(32))
    mem.save(tmp_path / "mem", 100, fp)
    slots = mem.mod.entries().astype("<i4")
    body = (struct.pack("<8sII32sQQQ", b"NGSRVMEM", 1, 100, fp, 2, 15, 64) + struct.pack("<II", 10, 5)
            + np.concatenate(reqs).astype("<i4").tobytes() + slots.tobytes())
    assert (tmp_path / "mem").read_bytes() == with_crc(body)
