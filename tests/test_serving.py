"""The serving parts that need no model: the cross-request memory (bounds, the memory
file: round trip, damage, another vocabulary, atomic saves), stop strings, and the engine
on a fake model (its answers, its typed errors, its queue bound, closing with a bounded
drain, saves that fail)."""

from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np
import pytest

from conftest import PROMPT, reference
from ngramcache import CacheFormatError, NgramCache
from ngramcache._state_file import VocabularyMismatchError
from ngramcache.decoding.costs import LearnedCosts
from ngramcache.serving import Engine, Job, Memory
from ngramcache.serving.engine import resolve_speculative
from ngramcache.serving.errors import (CancelledError, ContextOverflowError, QueueFullError, RequestError,
                                       ShuttingDownError)
from ngramcache.serving.stop_filter import StopFilter
from support import SERVING_VOCAB, ServingFakeModel

FP = bytes(range(32))
V = 1000


def _engine(model=None, **kw) -> Engine:
    kw.setdefault("adaptive", False)
    return Engine(model if model is not None else ServingFakeModel(), **kw)


def _text(tokens) -> str:
    return "".join(f"<{t}>" for t in tokens)


def _requests(n: int, length: int = 50, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, V, length).astype(np.int32) for _ in range(n)]


# --- the engine on a fake model --------------------------------------------------------

@pytest.mark.parametrize("spec", [None, {"drafter": "suffix"}, {"enabled": False}, {"n_draft": 0}])
def test_engine_answers_what_the_model_alone_would(spec):
    engine = _engine(memory=Memory(max_tokens=10_000, mod_size=1024))
    try:
        for _ in range(2):  # the second time drafts from memory, and reuses the KV cache
            pieces = []
            job = Job(prompt=np.array(PROMPT, dtype=np.int32), max_tokens=40, speculative=spec,
                      on_text=lambda text, drafted: pieces.append(text))
            r = engine.run(job, timeout=60)
            assert r.tokens.tolist() == reference(PROMPT, 40)
            assert r.text == "".join(pieces) == _text(r.tokens) and r.finish_reason == "length"
            assert r.drafter == (None if spec in ({"enabled": False}, {"n_draft": 0}) else
                                 (spec or {}).get("drafter", "copy"))
        assert engine.memory.n_requests == 2
    finally:
        assert engine.close(timeout=30)


def test_with_costs_the_drafter_is_gated_and_the_answer_unchanged():
    engine = _engine()
    engine.costs = LearnedCosts([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8])  # what adaptive=True starts from
    try:
        d = engine.make_drafter("copy", 8)
        assert d.gate is not None and d.gate.max_len == 8
        assert np.allclose(d.gate.curve()[:4], [1.0, 1.1, 1.2, 1.3])
        # every conversation's gate learns into the one curve of this machine
        assert d.gate.costs is engine.costs is engine.make_drafter("suffix", 4).gate.costs
        r = engine.run(Job(prompt=np.array(PROMPT, dtype=np.int32), max_tokens=40), timeout=60)
        assert r.tokens.tolist() == reference(PROMPT, 40)
    finally:
        engine.close(timeout=30)


def test_a_response_that_drafted_nothing_says_why():
    engine = _engine()
    engine.costs = LearnedCosts([1.0] + [100.0 + k for k in range(8)])  # no draft can pay here
    try:
        r = engine.run(Job(prompt=np.array(PROMPT, dtype=np.int32), max_tokens=40), timeout=60)
        assert r.drafted == 0 and r.tokens.tolist() == reference(PROMPT, 40)
        why = r.figures()["why_no_drafts"]
        assert why.startswith("nothing was drafted:") and "100.00x" in why
        engine.costs = LearnedCosts([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8])
        r = engine.run(Job(prompt=np.array(PROMPT, dtype=np.int32), max_tokens=40), timeout=60)
        assert r.drafted > 0 and r.figures()["why_no_drafts"] is None
    finally:
        engine.close(timeout=30)


def test_a_request_that_continues_a_conversation_goes_on_with_its_gate():
    engine = _engine()
    engine.costs = LearnedCosts([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6])
    made = []
    build = engine.make_drafter

    def spy(*args, **kw):
        d = build(*args, **kw)
        made.append((kw.get("gate"), d.gate))
        return d

    engine.make_drafter = spy
    try:
        first = np.array(PROMPT, dtype=np.int32)
        r1 = engine.run(Job(prompt=first, max_tokens=30), timeout=60)
        second = np.concatenate([first, r1.tokens, np.array([5, 6, 7], dtype=np.int32)])
        r2 = engine.run(Job(prompt=second, max_tokens=30), timeout=60)
        assert r2.tokens.tolist() == reference(second.tolist(), 30)
        engine.run(Job(prompt=np.array([9, 9, 9, 1, 2], dtype=np.int32), max_tokens=10), timeout=60)
    finally:
        engine.close(timeout=30)
    (given1, gate1), (given2, gate2), (given3, gate3) = made
    assert given1 is None and given2 is gate1 and gate2 is gate1  # the second turn learns on
    assert given3 is None and gate3 is not gate1  # another conversation starts afresh


@pytest.mark.parametrize("spec,param", [
    ({"drafter": "nope"}, "speculative.drafter"),
    ({"n_draft": 1000}, "speculative.n_draft"),
    ({"n_draft": True}, "speculative.n_draft"),
    ({"enabled": "yes"}, "speculative.enabled"),
    ({"colour": "red"}, "speculative.colour"),
    ("copy", "speculative"),
    ({"drafter": "suffix", "options": {"max_depth": 0}}, "speculative.options.max_depth"),
    ({"drafter": "suffix", "options": {"max_depth": "deep"}}, "speculative.options.max_depth"),
    ({"drafter": "suffix", "options": {"size_n": 3}}, "speculative.options.size_n"),
    ({"drafter": "suffix", "options": [1]}, "speculative.options"),
    ({"enabled": False, "drafter": None, "options": {"max_depth": 3}}, "speculative.options"),
])
def test_speculative_is_checked_once_with_the_field_named(spec, param):
    with pytest.raises(RequestError) as e:
        resolve_speculative(spec, "copy", 16)
    assert e.value.param == param and e.value.status == 400
    assert param in str(e.value)


def test_speculative_plans():
    assert resolve_speculative({"drafter": "mod", "n_draft": 4}, "copy", 16) == ("mod", 4, {})
    assert resolve_speculative(None, None, 16) == (None, 0, {})
    assert resolve_speculative({"enabled": False}, "copy", 16) == (None, 0, {})
    plan = resolve_speculative({"drafter": "suffix", "options": {"max_depth": 8, "min_prob": 1}}, "copy", 16)
    assert plan == ("suffix", 16, {"max_depth": 8, "min_prob": 1.0})
    assert type(plan.options["min_prob"]) is float


def test_a_request_s_drafter_options_reach_its_drafter():
    engine = _engine(drafter="suffix", drafter_options={"max_depth": 5, "alpha": 2.0})
    try:
        d = engine.make_drafter("suffix", 4, {"max_depth": 9})
        assert (d.max_depth, d.alpha) == (9, 2.0)  # the request's option over the server's
        assert engine.make_drafter("mod", 4).n_draft == 4
    finally:
        engine.close(timeout=30)


def test_submit_raises_typed_errors_that_carry_status_and_param():
    engine = _engine(ServingFakeModel(n_ctx=100))
    try:
        cases = [(Job(prompt=np.zeros(0, np.int32), max_tokens=4), RequestError, "prompt"),
                 (Job(prompt=np.ones(100, np.int32), max_tokens=0), ContextOverflowError, "prompt"),
                 (Job(prompt=np.ones(50, np.int32), max_tokens=51), ContextOverflowError, "max_tokens"),
                 (Job(prompt=np.ones(5, np.int32), max_tokens=-1), RequestError, "max_tokens"),
                 (Job(prompt=np.ones(5, np.int32), max_tokens=4, speculative={"drafter": "x"}), RequestError,
                  "speculative.drafter")]
        for job, kind, param in cases:
            with pytest.raises(kind) as e:
                engine.submit(job)
            assert type(e.value) is kind and e.value.param == param and e.value.status == 400
            assert isinstance(e.value, ValueError)  # a bad argument, for callers outside HTTP too
        with pytest.raises(ContextOverflowError) as e:
            engine.submit(cases[2][0])
        assert e.value.code == "context_length_exceeded"
        with pytest.raises(RequestError, match="beyond the vocabulary") as e:
            engine.check_tokens([1, SERVING_VOCAB])
        assert e.value.param == "prompt"
    finally:
        engine.close(timeout=30)


def test_a_full_queue_refuses_with_503():
    hold = threading.Event()
    engine = _engine(ServingFakeModel(hold=hold), max_queue=2)
    try:
        jobs = [engine.submit(Job(prompt=np.ones(4, np.int32), max_tokens=3))]
        deadline = time.monotonic() + 10
        while engine.running is None and time.monotonic() < deadline:  # the first one runs
            time.sleep(0.01)
        jobs += [engine.submit(Job(prompt=np.ones(4, np.int32), max_tokens=3)) for _ in range(2)]
        with pytest.raises(QueueFullError) as e:
            engine.submit(Job(prompt=np.ones(4, np.int32), max_tokens=3))
        assert e.value.status == 503 and e.value.code == "queue_full" and isinstance(e.value, RuntimeError)
        hold.set()
        for j in jobs:
            assert j.done.wait(30) and j.error is None
    finally:
        hold.set()
        engine.close(timeout=30)


def test_close_drains_for_a_bounded_time_then_stops_the_running_job(tmp_path):
    path = tmp_path / "memory.bin"
    engine = _engine(ServingFakeModel(delay=0.005), memory=Memory(max_tokens=10_000, mod_size=256), memory_path=path)
    short = engine.run(Job(prompt=np.array(PROMPT, np.int32), max_tokens=5), timeout=60)
    assert short.n_tokens == 5
    running = engine.submit(Job(prompt=np.array(PROMPT, np.int32), max_tokens=3000))
    queued = engine.submit(Job(prompt=np.array(PROMPT, np.int32), max_tokens=3))
    while engine.running is None:
        time.sleep(0.01)
    t0 = time.monotonic()
    assert engine.close(drain=0.3, timeout=10)
    took = time.monotonic() - t0
    assert 0.3 <= took < 5
    for job in (running, queued):
        assert job.done.is_set() and isinstance(job.error, ShuttingDownError) and job.error.status == 503
    assert "stopped after 0.3 s" in str(running.error)
    with pytest.raises(ShuttingDownError):
        engine.submit(Job(prompt=np.ones(4, np.int32), max_tokens=3))
    # the memory was saved by the worker as it stopped: the finished request, not the stopped one
    back = Memory.load(path, SERVING_VOCAB, engine.fingerprint())
    assert back.n_requests == 1 and back.n_tokens == len(PROMPT) + 5
    assert engine.close(timeout=1)  # again: nothing more to do


def test_close_waits_for_the_running_job_when_it_finishes_in_time():
    engine = _engine(ServingFakeModel(delay=0.002))
    job = engine.submit(Job(prompt=np.array(PROMPT, np.int32), max_tokens=20))
    while engine.running is None and not job.done.is_set():
        time.sleep(0.001)
    assert engine.close(drain=30, timeout=10)
    assert job.error is None and job.result.tokens.tolist() == reference(PROMPT, 20)


def test_close_gives_up_on_a_stuck_model_and_says_the_memory_is_not_saved(tmp_path, caplog):
    hold = threading.Event()
    engine = _engine(ServingFakeModel(hold=hold), memory=Memory(max_tokens=1000, mod_size=64),
                     memory_path=tmp_path / "m.bin")
    job = engine.submit(Job(prompt=np.ones(4, np.int32), max_tokens=3))
    while engine.running is None:
        time.sleep(0.01)
    t0 = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="ngramcache.serving"):
        assert engine.close(drain=0.1, timeout=0.3) is False
    assert time.monotonic() - t0 < 3
    assert "the memory is not saved" in caplog.text
    hold.set()  # the decode returns: the job ends stopped, and the worker saves as it goes
    assert job.done.wait(30) and isinstance(job.error, ShuttingDownError)
    assert engine.close(timeout=30)


def test_a_cancelled_job_that_never_started_ends_with_cancelled_error():
    hold = threading.Event()
    engine = _engine(ServingFakeModel(hold=hold))
    try:
        first = engine.submit(Job(prompt=np.ones(4, np.int32), max_tokens=2))
        second = engine.submit(Job(prompt=np.ones(4, np.int32), max_tokens=2))
        second.cancel()
        hold.set()
        assert first.done.wait(30) and second.done.wait(30)
        assert first.error is None and isinstance(second.error, CancelledError)
    finally:
        hold.set()
        engine.close(timeout=30)


def test_a_periodic_save_that_fails_is_logged_and_serving_goes_on(tmp_path, caplog):
    folder = tmp_path / "gone"
    folder.mkdir()
    engine = _engine(memory=Memory(max_tokens=1000, mod_size=64), memory_path=folder / "m.bin", save_every=0.01)
    folder.rmdir()  # every save now fails: its folder is gone
    try:
        with caplog.at_level(logging.ERROR, logger="ngramcache.serving"):
            for _ in range(3):
                r = engine.run(Job(prompt=np.array(PROMPT, np.int32), max_tokens=4), timeout=60)
                assert r.n_tokens == 4
                time.sleep(0.05)
        assert engine.save_errors and engine.last_save_error is not None
        assert "memory not saved to" in caplog.text and str(folder) in caplog.text
    finally:
        engine.close(timeout=30)


def test_an_idle_server_does_not_rewrite_an_unchanged_memory(tmp_path):
    engine = _engine(memory=Memory(max_tokens=1000, mod_size=64), memory_path=tmp_path / "m.bin", save_every=0.02)
    try:
        engine.run(Job(prompt=np.array(PROMPT, np.int32), max_tokens=4), timeout=60)
        deadline = time.monotonic() + 30
        while engine.saves == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.saves == 1
        time.sleep(0.3)  # fifteen intervals with nothing new learned
        assert engine.saves == 1
        engine.run(Job(prompt=np.array(PROMPT, np.int32), max_tokens=4), timeout=60)
        deadline = time.monotonic() + 30
        while engine.saves == 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.saves == 2
    finally:
        engine.close(timeout=30)


def test_the_static_table_reaches_the_drafters_that_read_one():
    table = NgramCache()
    table.update(np.array(PROMPT, np.int32), 2, 2)
    engine = _engine(static=table)
    try:
        assert engine.make_drafter("copy", 4).static is table
        assert engine.make_drafter("lookup", 4).static is table
        assert not hasattr(engine.make_drafter("suffix", 4), "static")
    finally:
        engine.close(timeout=30)


# --- the memory -----------------------------------------------------------------------

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
    assert mem.drafter_options("copy") == {"dynamic": mem.dynamic}
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
    # past the cap it forgets down to 3/4 of it (300 tokens: 6 requests of 50), then learns on
    assert 6 <= len(kept) <= 8 and mem.n_tokens == sum(a.size for a in kept)
    # the newest requests are the ones kept, in order
    assert [a.tolist() for a in kept] == [r.tolist() for r in reqs[-len(kept):]]
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
    reqs = _requests(7)
    for r in reqs:
        mem.learn(r)
    path = tmp_path / "mem.bin"
    mem.save(path, V, FP)
    back = Memory.load(path, V, FP, max_tokens=5000)
    assert (back.n_requests, back.n_tokens) == (mem.n_requests, mem.n_tokens) == (7, 350)
    assert [a.tolist() for a in back._history] == [r.tolist() for r in reqs]
    assert np.array_equal(back.mod.entries(), mem.mod.entries()) and mem.mod.used > 0
    assert len(back.dynamic) == len(mem.dynamic) > 0
    assert back.suffix.n_tokens == mem.suffix.n_tokens == 350
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
    # intact, but learned with other token ids: said so, not "damaged"
    for n_vocab, fp in [(V + 1, FP), (V, bytes(32))]:
        with pytest.raises(VocabularyMismatchError, match="server memory made for another vocabulary") as e:
            Memory.load(path, n_vocab, fp)
        assert "damaged" not in str(e.value)
    for blob, match in [(data[:-9], "truncated"), (data[:10], "truncated"), (b"XXXXXXXX" + data[8:], "magic"),
                        (data[:100] + bytes([data[100] ^ 1]) + data[101:], "checksum"),
                        (data[:8] + b"\x09\x00\x00\x00" + data[12:], "version 9")]:
        bad.write_bytes(blob)
        with pytest.raises(CacheFormatError, match=match) as e:
            Memory.load(bad, V, FP)
        assert "damaged or not a server memory file" in str(e.value) or "version" in str(e.value)
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
    f = StopFilter(stops)
    out = "".join(f.feed(p) for p in pieces) + f.flush()
    assert out == expected and f.stopped == stopped
    assert "".join(f.text) == expected


def test_acceptance_is_null_when_nothing_was_drafted():
    from ngramcache.serving.jobs import JobResult

    def result(drafted: int, accepted: int) -> dict:
        return JobResult(text="", tokens=np.zeros(3, dtype=np.int32), n_prompt=4, n_cached=0, finish_reason="stop",
                         drafter=None, drafted=drafted, accepted=accepted, t_prompt=0.1, t_draft=0.0,
                         t_verify=0.0, t_total=0.2, t_queue=0.0).figures()

    assert result(0, 0)["acceptance"] is None
    assert result(8, 6)["acceptance"] == 0.75
