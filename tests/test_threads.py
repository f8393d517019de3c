"""Threads sharing the core's objects.

Each test runs in a child interpreter whose faulthandler watchdog, if the child is still
running after its time, prints every thread's stack and exits: a deadlock fails the test
(with the stacks in its message) instead of hanging the suite.

The stress test runs every public operation of the shared objects from 8 threads at once
and compares with the same work run serially. The mix is chosen so that the outcome does
not depend on the interleaving: counts only ever added (equal final counts), drafting and
replays from caches nobody writes meanwhile (equal drafts and statistics), replays that
update a cache on private copies, a shared ngram-mod table whose writes rewrite the value
already in the slot, a suffix store whose drafters read while another store grows. What
does depend on the interleaving (a cache cleared and refilled while others read it) is
checked for what no interleaving may break: a reader sees a whole write or none of it.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import ngramcache as nc
import reference_speculative as ref
from ngramcache.drafters.catalog import DRAFTERS, make_drafter
from ngramcache.drafters.llama_ngram import NgramMod, NgramModTable
from ngramcache.replays import replay_drafter

TESTS = Path(__file__).resolve().parent


def run_watched(code: str, timeout: float) -> str:
    """Runs `code` in a child interpreter with the watchdog armed for `timeout` seconds;
    returns its stdout. Fails with the child's stderr (every thread's stack when the
    watchdog fired) if it did not exit cleanly."""
    prelude = (f"import faulthandler, sys; faulthandler.dump_traceback_later({timeout}, exit=True); "
               f"sys.path.insert(0, {str(TESTS)!r})\n")
    try:
        r = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True,
                           timeout=timeout + 60)
    except subprocess.TimeoutExpired as e:  # the watchdog itself could not run (the child is stuck hard)
        pytest.fail(f"the child outlived its watchdog ({timeout} s):\n{e.stderr}")
    if r.returncode != 0:
        if "Timeout (" in r.stderr:
            what = f"deadlock or hang: the watchdog fired after {timeout} s"
        else:
            what = f"the child exited with status {r.returncode}"
        pytest.fail(f"{what}; its stderr:\n{r.stderr[-30000:]}")
    return r.stdout


def test_the_watchdog_turns_a_hang_into_a_failure_with_every_stack():
    hang = """
import threading
def waits_forever():
    threading.Event().wait()
threading.Thread(target=waits_forever, daemon=True).start()
threading.Event().wait()
"""
    with pytest.raises(pytest.fail.Exception) as e:
        run_watched(hang, 2)
    assert "deadlock or hang" in str(e.value) and "waits_forever" in str(e.value)


# --- no deadlock between a replay holding a cache and calls from other threads ----------

_DEADLOCK_SCRIPT = """
import threading, numpy as np, ngramcache as nc
toks = np.random.default_rng(0).integers(0, 100, 400_000).astype(np.int32)
dyn, static = nc.NgramCache(), nc.NgramCache()
static.update(toks[:50_000])
seen = []
t1 = threading.Thread(target=nc.replay, args=(toks, 4096, 3),
                      kwargs=dict(dynamic=dyn, update_dynamic=True, progress=lambda d, t: seen.append(d)))
t2 = threading.Thread(target=nc.replay, args=(toks, 4096, 3), kwargs=dict(static=static))
copy = nc.CopyDrafter(dynamic=dyn, n_draft=8)
copy.reset(toks[:1000])
t1.start(); t2.start()
while t1.is_alive() or t2.is_alive():
    len(dyn); dyn.nbytes; dyn.get([1, 2]); dyn.arrays(); len(static)
    copy.propose(); copy.accept(toks[1000:1001])
t1.join(); t2.join()
static.clear(); dyn.clear()
assert seen and len(static) == 0 and len(dyn) == 0
print("done")
"""


def test_no_deadlock_between_a_replay_and_other_threads():
    assert run_watched(_DEADLOCK_SCRIPT, 120).strip() == "done"


# --- 8 threads, every operation, results equal to a serial run ---------------------------

N_THREADS = 8
ROUNDS = 10
CHURN_STEPS = 10


@pytest.mark.slow
def test_eight_threads_mixing_every_operation_match_a_serial_run(prose, tmp_path):
    np.save(tmp_path / "prose.npy", prose)
    out = run_watched(f"import test_threads; test_threads.stress({str(tmp_path)!r})", 240)
    assert out.strip().endswith("same as serial"), out


def counts(cache) -> dict:
    """A cache's contents without its order (which concurrent writers may change)."""
    return {k: sorted(p.items()) for k, p in cache.items()}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def replay_figures(st) -> tuple:
    return (st.n_chunks, st.n_steps, st.n_drafted, st.n_accept, tuple(st.accept_length_hist),
            tuple(sorted(st.drafted_by_source.items())), tuple(sorted(st.accepted_by_source.items())))


class Data:
    """Everything fixed: token streams, the caches and files nobody writes, what a whole
    write of the churned objects looks like."""

    def __init__(self, folder: Path):
        self.folder = folder
        p = np.load(folder / "prose.npy")
        self.text = p[:34_000]
        self.context = nc.NgramCache()
        self.context.update(self.text[:6000])
        self.dynamic = nc.NgramCache()
        self.dynamic.update(self.text[6000:12_000])
        self.static_cache = nc.NgramCache()
        self.static_cache.update(self.text[:16_000], 2, 2)
        self.table_path = folder / "static.ngst"
        nc.StaticTable.build(self.text[:16_000]).save(self.table_path)
        self.pieces = [nc.NgramCache() for _ in range(N_THREADS)]
        for i, c in enumerate(self.pieces):
            c.update(self.text[12_000 + 300 * i: 12_000 + 300 * (i + 1)])
        # the churned cache and store are only ever cleared or given these whole; the
        # cache's are many, so that its updates and reads take long enough to overlap
        self.churn_tokens = self.text[30_000:33_000]
        one = nc.NgramCache()
        one.update(self.churn_tokens)
        self.churn_one = counts(one)
        self.churn_arrays = one.arrays()
        self.store_tokens = self.text[20_000:20_400]
        # ngram-mod: a random text repeated, whose windows have one continuation per slot of
        # a default-sized table, so replaying it on a table filled with it rewrites only
        # values already there
        self.mod_n = 6
        for seed in range(100):
            r = np.random.default_rng(seed).integers(0, 50, 600)
            s = np.tile(r, 4).astype(np.int32)
            slots: dict = {}
            if all(slots.setdefault(ref.mod_slot(s[i:i + self.mod_n].tolist(), ref.MOD_SIZE), int(s[i + self.mod_n]))
                   == int(s[i + self.mod_n]) for i in range(s.size - self.mod_n)):
                break
        else:
            raise AssertionError("no stream with one continuation per slot")
        self.mod_stream = s
        self.suffix_requests = [self.text[i * 900:(i + 1) * 900] for i in range(6)]


class Shared:
    """The objects the threads share, made afresh for the serial and the concurrent run."""

    def __init__(self, d: Data):
        self.acc = nc.NgramCache()  # only ever added to
        self.acc.update(d.text[:500])
        self.target = nc.NgramCache()  # replays merge their chunks into it
        self.churn = nc.NgramCache()  # cleared and refilled while others read it
        self.mod_table = NgramModTable()
        NgramMod(d.mod_n, 1, 16, self.mod_table).begin(d.mod_stream)
        self.mod_churn = NgramModTable(4096)  # reset while others draft from it
        self.store = nc.SuffixStore(max_depth=16)  # read only
        for r in d.suffix_requests:
            self.store.add(r)
        self.growing = nc.SuffixStore(max_depth=16)  # only ever added to, never full
        self.store_churn = nc.SuffixStore(max_tokens=2000, max_depth=16)  # cleared and refilled
        self.table = nc.StaticTable.open(d.table_path)


def walk(drafter, seq: np.ndarray, start: int, stop: int, one_by_one: bool = False) -> list:
    """The proposals of a drafter driven over seq[start:stop] as a speculative loop drives
    it: each step accepts the proposal's matching prefix and the next true token (only
    the next true token when `one_by_one`, so that the sequence ends at `stop` whatever
    was proposed)."""
    drafter.reset(seq[:start])
    out = []
    pos = start
    while pos < stop:
        d = drafter.propose()
        out.append(d.tolist())
        k = 0
        while not one_by_one and k < d.size and pos + k < seq.size - 1 and seq[pos + k] == d[k]:
            k += 1
        drafter.accept(seq[pos:pos + k + 1])
        pos += k + 1
    return out


def copies_of_churn(c, d: Data) -> int:
    """How many whole copies of churn_tokens' n-grams the cache holds: a cache only ever
    cleared or given them whole holds k copies, in the order of one; anything else, e.g.
    a reader that saw part of an update, fails."""
    keys, offsets, toks, cnts = c.arrays()
    if keys.shape[0] == 0:
        return 0
    k_one, o_one, t_one, c_one = d.churn_arrays
    k = int(cnts[0]) // int(c_one[0])
    assert k >= 1 and np.array_equal(keys, k_one) and np.array_equal(offsets, o_one) and \
        np.array_equal(toks, t_one) and np.array_equal(cnts, c_one * k), "a reader saw part of an update"
    return k


def check_loaded_churn(c, d: Data) -> None:
    """copies_of_churn for a cache read back from a file or bytes (loading orders it anew)."""
    got = counts(c)
    if got:
        key = next(iter(d.churn_one))
        k = got[key][0][1] // d.churn_one[key][0][1]
        assert k >= 1 and got == {key_: [(t, n * k) for t, n in p] for key_, p in d.churn_one.items()}, \
            "a reader saw part of an update"


def check_arrays(c) -> None:
    keys, offsets, toks, cnts = c.arrays()
    assert offsets[0] == 0 and offsets[-1] == toks.size == cnts.size and keys.shape == (offsets.size - 1, 4)
    assert (np.diff(offsets) > 0).all() and (cnts > 0).all() and (toks >= 0).all()


def work(i: int, d: Data, s: Shared) -> dict:
    """Thread i's share of every operation; returns what must not depend on other threads."""
    out: dict = {}
    text = d.text
    mine = d.folder / f"thread{i}"
    mine.mkdir(exist_ok=True)

    def cache_ops(r):
        # counts only ever added: the final counts equal the serial run's
        s.acc.update(text[1000 + 200 * i: 1300 + 200 * i], 1, 4)
        s.acc.merge(d.pieces[(i + r) % N_THREADS])
        s.acc.update(text[4000 + 50 * r: 4100 + 50 * r], 1, 4, nnew=30)
        assert len(s.acc) > 0 and s.acc.nbytes > 0
        check_arrays(s.acc)
        first = next(s.acc.items())
        assert len(first[0]) >= 1 and first[1]
        s.acc.get(text[1000:1002])
        assert nc.NgramCache.from_bytes(s.acc.to_bytes()).nbytes > 0

    def churn_ops(r):
        # tight, so that the C++ calls dominate and overlap other threads' on the same cache
        for k in range(CHURN_STEPS):
            if (i + k) % 3 == 0:
                s.churn.clear()
            else:
                s.churn.update(d.churn_tokens)
            copies_of_churn(s.churn, d)
            assert len(s.churn) in (0, len(d.churn_one))
            got = s.churn.get(d.churn_tokens[:2])
            one = dict(d.churn_one[tuple(d.churn_tokens[:2].tolist())])
            assert not got or {t: n * (sum(got.values()) // sum(one.values())) for t, n in one.items()} == got
            p = 40 + 37 * i + k
            # whatever the cache holds meanwhile, a draft from it is made of its tokens (no
            # static source: that one would fill in where the cache is empty)
            dr = nc.draft(d.churn_tokens[:p], 8, s.churn, s.churn)
            assert dr.dtype == np.int32 and dr.size <= 8 and np.isin(dr, d.churn_tokens).all()
        check_loaded_churn(nc.NgramCache.from_bytes(s.churn.to_bytes()), d)
        s.churn.save(mine / "churn.bin")
        check_loaded_churn(nc.NgramCache.load(mine / "churn.bin"), d)

    def draft_ops(r):
        res = []
        for k, p in enumerate(range(200 + 97 * i + r, 12_000, 997)):
            static = s.table if k % 2 else d.static_cache
            res.append(nc.draft(text[:p], 8, d.context, d.dynamic, static).tolist())
        out[f"draft{r}"] = res

    def replay_ops(r):
        a = 2000 * ((i + r) % 4)
        chunk = text[a:a + 2401]
        out[f"replay{r}"] = replay_figures(nc.replay(chunk, 800, 8, static=s.table, dynamic=d.dynamic))
        private = nc.NgramCache()
        private.merge(d.dynamic)
        st = nc.replay(chunk, 800, 8, static=d.static_cache, dynamic=private, update_dynamic=True)
        out[f"replay_private{r}"] = (replay_figures(st), digest(private.to_bytes()))
        # chunks merged into one shared cache: the final counts equal the serial run's
        # (its progress callback takes the GIL back while the replay holds the cache's lock)
        seen = []
        nc.replay(chunk, 800, 4, static=s.table, dynamic=s.target, update_dynamic=True,
                  progress=lambda done, total: seen.append(done))
        assert seen[-1] == 2400

    def table_ops(r):
        t = nc.StaticTable.open(d.table_path)
        key = text[100 + i:102 + i]
        out[f"table{r}"] = (t.get(key), t.best(key), key in t, len(t), digest(t.to_cache().to_bytes()),
                            [nc.draft(text[:p], 6, d.context, None, t).tolist() for p in range(50 + i, 6000, 701)])
        assert s.table.get(key) == out[f"table{r}"][0]

    def drafter_ops(r):
        for name in DRAFTERS:
            opts = {}
            seq, start = text, 3000 + 500 * i
            if name in ("lookup", "copy"):
                opts = {"static": s.table if (i + r) % 2 else d.static_cache, "dynamic": d.dynamic}
            elif name == "suffix":
                opts = {"store": s.store, "max_depth": 16}
            elif name == "mod":
                opts = {"table": s.mod_table, "n_match": d.mod_n, "n_min": 1, "n_max": 16}
                seq, start = d.mod_stream, 1 + 100 * i
            elif name in ("simple", "map-k", "map-k4v"):  # they need a repeated 12-gram to draft
                seq, start = d.mod_stream, 600 + 100 * i
            drafter = make_drafter(name, n_draft=8, **opts)
            out[f"{name}{r}"] = walk(drafter, seq, start, start + 300)
        copy = make_drafter("copy", n_draft=8, static=s.table, dynamic=d.dynamic)
        st = replay_drafter(text[5000:7401], copy, 800, 8)
        mod = make_drafter("mod", n_draft=16, table=s.mod_table, n_match=d.mod_n, n_min=1, n_max=16)
        st2 = replay_drafter(d.mod_stream, mod, 600, 16)
        out[f"replay_drafter{r}"] = (replay_figures(st)[:5], replay_figures(st2)[:5])
        assert s.mod_table.get(d.mod_stream[:d.mod_n]) == d.mod_stream[d.mod_n]
        assert s.mod_table.resets == 0 and s.mod_table.used > 0 and s.mod_table.nbytes == 4 * s.mod_table.size

    def shared_store_ops(r):
        # the growing store: requests only added, never evicted
        s.growing.add(text[12_000 + 100 * i + r: 12_200 + 100 * i + r])
        sd = make_drafter("suffix", n_draft=8, store=s.growing, max_depth=16)
        walk(sd, text[12_400 + 100 * i: 12_600 + 100 * i], 100, 200, one_by_one=True)
        sd.finish()
        # (other threads add between these calls; nothing is ever evicted)
        before = s.growing.n_tokens
        held = sum(x.size for x in s.growing.requests())
        assert before <= held <= s.growing.n_tokens
        # the churned store: cleared or given whole copies of churn_tokens
        if (i + r) % 3 == 0:
            s.store_churn.clear()
        else:
            s.store_churn.add(d.store_tokens)
        reqs = s.store_churn.requests()
        assert all(x.tolist() == d.store_tokens.tolist() for x in reqs), "a reader saw part of an add"
        assert s.store_churn.n_tokens <= s.store_churn.max_tokens and s.store_churn.nbytes > 0
        walk(make_drafter("suffix", n_draft=8, store=s.store_churn, max_depth=16), d.store_tokens, 50, 150)

    def mod_churn_ops(r):
        # a table reset while others draft from it: every drafted token is one some add stored
        m = make_drafter("mod", n_draft=8, table=s.mod_churn, n_match=4, n_min=1, n_max=8)
        for prop in walk(m, d.mod_stream, 1, 400):
            assert set(prop) <= set(range(50))
        if r == i % ROUNDS:
            s.mod_churn.reset()
        assert 0 <= s.mod_churn.used <= s.mod_churn.size

    ops = [cache_ops, churn_ops, draft_ops, replay_ops, table_ops, drafter_ops, shared_store_ops, mod_churn_ops]
    for r in range(ROUNDS):
        for k in range(len(ops)):
            ops[(i + k) % len(ops)](r)  # each thread starts elsewhere in the mix
    return out


def final_state(s: Shared, folder: Path) -> dict:
    s.mod_table.save(folder / "mod.ngmt")
    return {"acc": counts(s.acc), "target": counts(s.target),
            "growing": sorted(tuple(x.tolist()) for x in s.growing.requests()),
            "mod_table": digest((folder / "mod.ngmt").read_bytes())}


def stress(folder: str) -> None:
    """Runs the mix serially, then from N_THREADS threads at once, and compares."""
    d = Data(Path(folder))
    serial_shared = Shared(d)
    serial = [work(i, d, serial_shared) for i in range(N_THREADS)]
    expected = final_state(serial_shared, d.folder)

    s = Shared(d)
    results: list = [None] * N_THREADS
    errors: list = []
    start = threading.Barrier(N_THREADS)

    def run(i):
        try:
            start.wait()
            results[i] = work(i, d, s)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,), name=f"stress-{i}") for i in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0][1]
    for i in range(N_THREADS):
        for key, want in serial[i].items():
            assert results[i][key] == want, f"thread {i}: {key} differs from the serial run"
    got = final_state(s, d.folder)
    for key, want in expected.items():
        assert got[key] == want, f"final state of {key} differs from the serial run"
    print("same as serial")
