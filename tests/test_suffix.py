"""SuffixDrafter and SuffixStore: proposals equal the brute force of reference_suffix.py
(random streams, real text, several requests through a store, eviction), argument
checks, and a store shared by threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ngramcache as nc
import reference_suffix as ref
from conftest import alphabets, streams
from ngramcache import _core
from ngramcache.decoding.gate import Gate, GatedDrafter
from ngramcache.drafters.base import Source
from ngramcache.drafters.suffix import SuffixDrafter, SuffixStore
from ngramcache.replays import replay_drafter

params = st.fixed_dictionaries({
    "max_depth": st.integers(1, 8),
    "alpha": st.sampled_from([0.5, 1.0, 2.0, 3.5, 100.0]),
    "min_prob": st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0]),
})


def run_both(reqs, p, store_args=None, n_draft=16, schedule=None):
    """Replay the requests through SuffixDrafter and the model side by side, accepting the
    true text in batches from ``schedule`` and proposing with varying n_max."""
    store = SuffixStore(**store_args) if store_args is not None else None
    rstore = ref.RefStore(**store_args) if store_args is not None else None
    d = SuffixDrafter(n_draft=n_draft, store=store, **p)
    r = ref.RefSuffixDrafter(n_draft=n_draft, store=rstore, **p)
    sched = schedule or [1, 2, 3]
    step = 0
    for t in reqs:
        np_ = min(len(t), sched[step % len(sched)])
        d.reset(t[:np_])
        r.reset(t[:np_])
        if store is not None:
            assert (store.n_requests, store.n_tokens) == (len(rstore.reqs), rstore.n_tokens)
        have = np_
        while True:
            n_max = (step * 7) % (n_draft + 3)
            step += 1
            want = r.propose(n_max)
            step_of = d.proposal(n_max)  # one call: the proposal with its confidence and source
            got = d.propose(n_max)
            assert got.tolist() == want == step_of.tokens.tolist(), (have, n_max)
            if got.size:
                assert step_of.confidence == r.confidence and step_of.source is Source.SUFFIX
            if have >= len(t):
                break
            k = min(len(t) - have, sched[step % len(sched)])
            d.accept(t[have:have + k])
            r.accept(t[have:have + k])
            have += k
    return d, r


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=6).flatmap(
    lambda sched: st.tuples(st.just(sched), streams(min_len=1, max_len=80, alphabet=[1, 2, 3]))), params)
def test_one_request_matches_brute_force(sched_stream, p):
    sched, stream = sched_stream
    run_both([stream], p, schedule=sched)


@settings(max_examples=100, deadline=None)
@given(st.data(), params, st.integers(5, 120), st.integers(1, 8))
def test_requests_through_a_store_match_brute_force(data, p, max_tokens, store_depth):
    alpha = data.draw(alphabets(2, 4))
    reqs = data.draw(st.lists(streams(min_len=0, max_len=40, alphabet=alpha), min_size=1, max_size=6))
    run_both(reqs, p, {"max_tokens": max_tokens, "max_depth": store_depth})


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 60000 - 400), st.integers(0, 60000 - 400), st.integers(2, 24))
def test_real_text_matches_brute_force(prose, a, b, depth):
    # two slices of prose: the first a finished request, the second the current one
    reqs = [prose[a:a + 300].tolist(), prose[b:b + 200].tolist()]
    run_both(reqs, {"max_depth": depth, "alpha": 4.0, "min_prob": 0.05}, {"max_tokens": 1000, "max_depth": 24},
             schedule=[1, 4, 2])


def test_eviction_keeps_whole_requests_oldest_first():
    s = SuffixStore(max_tokens=10)
    for n in (4, 3, 2):
        s.add(list(range(n)))
    assert (len(s), s.n_tokens) == (3, 9)
    s.add([7, 7, 7])  # 12 > 10: the oldest (4 tokens) goes
    assert (len(s), s.n_tokens) == (3, 8)
    s.add(list(range(11)))  # longer than the bound: not kept, nothing evicted
    assert (len(s), s.n_tokens) == (3, 8)
    s.add([])
    assert len(s) == 3
    s.clear()
    assert (len(s), s.n_tokens, s.n_requests) == (0, 0, 0)


def test_nbytes_follows_what_is_held():
    s = SuffixStore(max_tokens=5000, max_depth=16)
    empty = s.nbytes
    rng = np.random.default_rng(3)
    text = rng.integers(0, 1000, 2000)
    s.add(text)
    grown = s.nbytes
    # at least a node's fields for every node, and the tokens themselves
    assert grown >= empty + 40 * s._impl.n_nodes + 4 * text.size
    # text that does not repeat is not a chain of max_depth + 1 nodes a token
    assert s._impl.n_nodes < 4 * text.size
    s.add(text)  # seen twice: its strings become nodes, up to max_depth + 1 a token
    assert s._impl.n_nodes > 10 * text.size
    assert s.nbytes > grown
    s.clear()  # gives the memory back
    assert s.nbytes <= empty
    d = SuffixDrafter(max_depth=16)
    before = d.nbytes
    d.reset(text)
    assert d.nbytes >= before + 40 * d._impl.n_nodes + 4 * text.size
    assert d._impl.n_nodes < 4 * text.size


def test_store_drafts_a_repeat_of_an_earlier_request():
    earlier = list(range(100, 140))
    store = SuffixStore()
    d = SuffixDrafter(store=store, alpha=100.0)
    d.reset(earlier)
    d.reset([5, 6] + earlier[:6])  # the earlier request goes to the store here
    assert len(store) == 1
    assert d.propose(16).tolist() == earlier[6:22]
    assert d.proposal(16).confidence == 6
    d.finish()  # this request too; the drafter is empty again
    assert len(store) == 2 and d.tokens.size == 0
    d.reset([1])
    assert len(store) == 2  # finish() already handed it over


def test_gate_source_and_stats():
    d = GatedDrafter(SuffixDrafter(alpha=100.0), Gate([1.0] * 17))
    assert SuffixDrafter._SOURCE is Source.SUFFIX
    d.reset([1, 2, 3, 4, 1, 2])
    out = d.propose()
    assert out.tolist()[:2] == [3, 4]
    d.accept([3, 4, 9])
    assert d.stats.accepted == 2


def test_replay_drafter_runs_in_the_core(prose):
    store = SuffixStore()
    d = SuffixDrafter(store=store)
    r = _core.replay_drafter(d._impl, prose[:4 * 512 + 1], 512, 16, None)
    assert r.n_chunks == 4 and r.n_accept > 0
    assert len(store) == 3  # the last chunk is still the drafter's own
    # the public replay of a fresh drafter and store counts what the core counted
    got = replay_drafter(prose[:4 * 512 + 1], SuffixDrafter(store=SuffixStore()), 512, 16)
    assert got.drafter == "suffix"
    assert (got.n_chunks, got.n_steps, got.n_drafted, got.n_accept) == (r.n_chunks, r.n_steps, r.n_drafted,
                                                                         r.n_accept)
    assert list(got.accept_length_hist) == list(r.accept_length_hist)


@pytest.mark.parametrize("kw, match", [
    ({"max_depth": 0}, "max_depth"), ({"max_depth": 1025}, "max_depth"), ({"max_depth": 2.0}, "max_depth"),
    ({"alpha": 0}, "alpha"), ({"alpha": float("inf")}, "alpha"), ({"alpha": "2"}, "alpha"),
    ({"min_prob": -0.1}, "min_prob"), ({"min_prob": 1.5}, "min_prob"), ({"min_prob": float("nan")}, "min_prob"),
    ({"n_draft": -1}, "n_draft"), ({"alpha": True}, "alpha"),
])
def test_bad_drafter_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        SuffixDrafter(**kw)


def test_bad_store_arguments():
    with pytest.raises(TypeError, match="store must be a SuffixStore"):
        SuffixDrafter(store=_core.SuffixStore(10, 4))
    with pytest.raises(ValueError, match="max_tokens"):
        SuffixStore(max_tokens=0)
    with pytest.raises(ValueError, match="max_depth"):
        SuffixStore(max_depth=0)
    s = SuffixStore()
    with pytest.raises(ValueError):
        s.add([1, -2])
    with pytest.raises(ValueError):
        s.add("abc")
    d = SuffixDrafter()
    with pytest.raises(ValueError):
        d.reset([[1, 2]])
    with pytest.raises(ValueError, match="n_max"):
        d.propose(-1)


def _walk(store, tokens, n_draft=16):
    d = SuffixDrafter(store=store, max_depth=16)
    d.reset(tokens[:1])
    out = []
    for i in range(1, len(tokens)):
        out.append(d.propose(n_draft).tolist())
        d.accept(tokens[i:i + 1])
    return out


def test_threads_share_a_store(prose):
    store = SuffixStore(max_tokens=3000, max_depth=16)
    for i in range(4):
        store.add(prose[i * 500:(i + 1) * 500])
    texts = [prose[4000 + i * 300: 4000 + (i + 1) * 300] for i in range(4)]
    sequential = [_walk(store, t) for t in texts]
    results = [None] * 4

    def work(i):
        results[i] = _walk(store, texts[i])

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert results == sequential  # the store did not change: the same proposals

    # replays (without the GIL) add requests while other threads propose: no crash, and
    # the bound holds
    errors = []

    def replay(i):
        try:
            _core.replay_drafter(SuffixDrafter(store=store)._impl, prose[i * 5000:(i + 1) * 5000 + 1], 700, 16, None)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=replay, args=(i,)) for i in range(3)]
    ts += [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert store.n_tokens <= 3000


# --- saving and loading a store ------------------------------------------------------

def _filled_store(max_tokens=5000):
    rng = np.random.default_rng(7)
    store = SuffixStore(max_tokens=max_tokens, max_depth=16)
    phrases = [rng.integers(0, 50, rng.integers(3, 12)) for _ in range(10)]
    for _ in range(12):
        store.add(np.concatenate([phrases[i] for i in rng.integers(0, 10, 20)]))
    return store


def _proposals(store, toks):
    d = SuffixDrafter(n_draft=8, max_depth=16, store=store)
    d.reset(toks[:5])
    out = []
    for i in range(5, toks.size):
        out.append(d.propose().tolist())
        d.accept(toks[i : i + 1])
    return out


def test_store_save_load_round_trip(tmp_path):
    store = _filled_store()
    path = tmp_path / "memory.ngss"
    store.save(path)
    back = SuffixStore.load(path)
    assert (back.max_tokens, back.max_depth, back.n_requests, back.n_tokens) == \
        (store.max_tokens, store.max_depth, store.n_requests, store.n_tokens)
    assert [r.tolist() for r in back.requests()] == [r.tolist() for r in store.requests()]
    probe = store.requests()[-1][:60]
    assert _proposals(back, probe) == _proposals(store, probe)
    assert any(_proposals(back, probe))


def test_store_load_with_a_smaller_bound_keeps_the_newest(tmp_path):
    store = _filled_store()
    path = tmp_path / "memory.ngss"
    store.save(path)
    newest = store.requests()[-1]
    back = SuffixStore.load(path, max_tokens=newest.size + 1)
    assert back.n_requests == 1 and back.requests()[0].tolist() == newest.tolist()


def test_empty_store_round_trip(tmp_path):
    path = tmp_path / "empty.ngss"
    SuffixStore(max_tokens=10).save(path)
    back = SuffixStore.load(path)
    assert back.n_requests == 0 and back.max_tokens == 10


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:20], "truncated"),
    (lambda b: b"XXXX" + b[4:], "not a suffix store"),
    (lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:], "checksum"),
    (lambda b: b[:-10], "checksum"),
])
def test_store_load_rejects_damaged_files(tmp_path, damage, message):
    path = tmp_path / "memory.ngss"
    _filled_store().save(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(nc.CacheFormatError, match=message):
        SuffixStore.load(path)


def test_store_load_rejects_another_version_and_bad_lengths(tmp_path):
    import struct
    import zlib

    path = tmp_path / "memory.ngss"
    _filled_store().save(path)
    body = bytearray(path.read_bytes()[:-4])
    body[4:8] = struct.pack("<I", 99)
    path.write_bytes(bytes(body) + struct.pack("<I", zlib.crc32(bytes(body))))
    with pytest.raises(nc.CacheFormatError, match="version 99"):
        SuffixStore.load(path)
    body[4:8] = struct.pack("<I", 1)
    body[32:40] = struct.pack("<Q", 10**6)  # the first request's length
    path.write_bytes(bytes(body) + struct.pack("<I", zlib.crc32(bytes(body))))
    with pytest.raises(nc.CacheFormatError, match="lengths"):
        SuffixStore.load(path)
    with pytest.raises(FileNotFoundError):
        SuffixStore.load(tmp_path / "missing.ngss")


def test_store_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "memory.ngss"
    _filled_store().save(path)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("ngramcache._state_file.zlib.crc32", boom)
    with pytest.raises(OSError):
        SuffixStore(max_tokens=10).save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["memory.ngss"]
