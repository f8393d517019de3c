"""The server's engine parts that need no model: the cross-request memory (bounds, the
memory file: round trip, damage, another vocabulary, atomic saves) and stop strings."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ngramcache import CacheFormatError, NgramCache
from ngramcache.serving.engine import Memory, _StopFilter

FP = bytes(range(32))
V = 1000


def _requests(n: int, length: int = 50, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, V, length).astype(np.int32) for _ in range(n)]


def test_memory_learns_every_state():
    mem = Memory(max_tokens=10_000, mod_size=4096)
    seq = np.array([5, 6, 7, 8, 5, 6, 7, 9] * 8, dtype=np.int32)
    mem.learn(seq)
    assert mem.n_requests == 1 and mem.n_tokens == seq.size
    expected = NgramCache()
    expected.update(seq, 1, 4)
    assert mem.dynamic.get([5, 6]) == expected.get([5, 6])
    assert mem.suffix.n_tokens == seq.size
    assert mem.mod.used > 0
    assert set(mem.drafter_options("copy")) == {"dynamic"}
    assert mem.drafter_options("suffix") == {"store": mem.suffix}
    assert mem.drafter_options("mod") == {"table": mem.mod}
    assert mem.drafter_options("simple") == {}


def test_memory_is_bounded_and_forgets_the_oldest_first():
    mem = Memory(max_tokens=400, mod_size=4096)
    reqs = _requests(30)
    for r in reqs:
        mem.learn(r)
        assert mem.n_tokens <= 400
    assert mem.suffix.n_tokens <= 400
    kept = list(mem._history)
    # the newest requests are the ones kept, in order
    assert all(np.array_equal(a, b) for a, b in zip(kept, reqs[-len(kept):]))
    # the dynamic cache counts exactly what is kept
    rebuilt = NgramCache()
    for r in kept:
        rebuilt.update(r, 1, 4)
    assert len(mem.dynamic) == len(rebuilt)
    for r in kept[:3]:
        assert mem.dynamic.get(r[:2]) == rebuilt.get(r[:2])
    assert not any(mem.dynamic.get(r[:3]) and not rebuilt.get(r[:3]) for r in reqs[:5])


def test_memory_file_round_trip(tmp_path):
    mem = Memory(max_tokens=5000, mod_size=4096)
    for r in _requests(7):
        mem.learn(r)
    path = tmp_path / "mem.bin"
    mem.save(path, V, FP)
    back = Memory.load(path, V, FP, max_tokens=5000)
    assert back.n_requests == mem.n_requests and back.n_tokens == mem.n_tokens
    assert all(np.array_equal(a, b) for a, b in zip(back._history, mem._history))
    assert np.array_equal(back.mod._core.entries(), mem.mod._core.entries())
    assert len(back.dynamic) == len(mem.dynamic)
    assert back.suffix.n_tokens == mem.suffix.n_tokens
    # a smaller budget at load keeps the newest
    small = Memory.load(path, V, FP, max_tokens=120)
    assert small.n_tokens <= 120 and np.array_equal(small._history[-1], mem._history[-1])
    # an empty memory saves and loads too
    Memory(mod_size=64).save(path, V, FP)
    assert Memory.load(path, V, FP).n_requests == 0


def test_memory_file_refuses_damage_and_another_vocabulary(tmp_path):
    mem = Memory(max_tokens=5000, mod_size=1024)
    for r in _requests(3):
        mem.learn(r)
    path = tmp_path / "mem.bin"
    mem.save(path, V, FP)
    data = path.read_bytes()
    bad = tmp_path / "bad.bin"
    with pytest.raises(CacheFormatError, match="another model's vocabulary"):
        Memory.load(path, V + 1, FP)
    with pytest.raises(CacheFormatError, match="another model's vocabulary"):
        Memory.load(path, V, bytes(32))
    for blob, match in [(data[:-9], "truncated"), (data[:10], "truncated"), (b"XXXXXXXX" + data[8:], "magic"),
                        (data[:100] + bytes([data[100] ^ 1]) + data[101:], "checksum"),
                        (data[:8] + b"\x09\x00\x00\x00" + data[12:], "version 9")]:
        bad.write_bytes(blob)
        with pytest.raises(CacheFormatError, match=match):
            Memory.load(bad, V, FP)
    with pytest.raises(FileNotFoundError):
        Memory.load(tmp_path / "missing.bin", V, FP)


def test_memory_save_is_atomic(tmp_path, monkeypatch):
    mem = Memory(max_tokens=5000, mod_size=1024)
    mem.learn(_requests(1)[0])
    path = tmp_path / "mem.bin"
    mem.save(path, V, FP)
    before = path.read_bytes()
    mem.learn(_requests(1, seed=1)[0])

    class Interrupted(Exception):
        pass

    calls = {"n": 0}
    real_write = os.fdopen

    def fdopen(*a, **k):
        f = real_write(*a, **k)
        orig = f.write

        def write(b):
            calls["n"] += 1
            if calls["n"] == 3:  # halfway through the file
                raise Interrupted()
            return orig(b)

        f.write = write
        return f

    monkeypatch.setattr("ngramcache.files.os.fdopen", fdopen)
    with pytest.raises(Interrupted):
        mem.save(path, V, FP)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["mem.bin"]  # no temporary file left behind


@pytest.mark.parametrize("stops,pieces,expected,stopped", [
    ([], ["ab", "cd"], "abcd", False),
    (["\n"], ["ab", "c\nd", "e"], "abc", True),
    (["END"], ["xx E", "N", "Dyy"], "xx ", True),
    (["END"], ["xx E", "N", "ot"], "xx ENot", False),
    (["bc", "c"], ["abcd"], "a", True),
])
def test_stop_filter(stops, pieces, expected, stopped):
    f = _StopFilter(stops)
    out = "".join(f.feed(p) for p in pieces) + f.flush()
    assert out == expected and f.stopped == stopped
    assert "".join(f.text) == expected
