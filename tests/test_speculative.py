"""ngramcache.drafters.llama_ngram: llama.cpp's ngram-simple, ngram-map-k/k4v and ngram-mod.

Every draft of llama.cpp's own runs (vectors/drafters, produced by the real
common/speculative.cpp) is reproduced with the README's driver loop; property tests hold
the compiled drafters against reference_speculative.py (the reference's O(context)
scans) on random streams and on real text, including rewritten prompts; the Drafter
classes propose what the llama.cpp-shaped classes draft; threads sharing one
NgramModTable draft what a lone drafter drafts.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ngramcache as nc
import reference_speculative as ref
from conftest import VECTORS, jsonl_bytes
from ngramcache import _core
from ngramcache.drafters.llama_ngram import (NgramMapDrafter, NgramMapK, NgramMod, NgramModDrafter, NgramModTable,
                                    NgramSimple, NgramSimpleDrafter)

# --- llama.cpp's own drafts ------------------------------------------------------------

VECTOR_RUNS = {
    "prose.ngram-simple.n12m48": (lambda: NgramSimple(12, 48), True),
    "prose.ngram-simple.n3m8": (lambda: NgramSimple(3, 8), True),
    "prose.ngram-map-k.n12m48": (lambda: NgramMapK(12, 48, 1), True),
    "prose.ngram-map-k.n12m48.nobegin": (lambda: NgramMapK(12, 48, 1), False),
    "prose.ngram-mod.m24min48max64": (lambda: NgramMod(24, 48, 64), True),
    "prose.ngram-mod.m8min1max16": (lambda: NgramMod(8, 1, 16), True),
}


@pytest.fixture(scope="module")
def drafter_vectors():
    d = None if VECTORS is None else VECTORS / "drafters"
    if d is None or not (d / "prose.drafters.header.json").is_file():
        pytest.skip("llama.cpp's drafter vectors not found (vectors/drafters; set NGRAMCACHE_VECTORS)")
    return d


@pytest.fixture(scope="module")
def prose_stream(drafter_vectors) -> np.ndarray:
    return np.fromfile(drafter_vectors.parent / "prose.tokens.i32", dtype="<i4").astype(np.int32)


def drive(drafter, stream, begin: bool, as_views: bool = False):
    """The README's loop: a draft at every pos = 1..N (prompt = stream[:pos-1], id_last =
    stream[pos-1]), begin(stream[:512]) right before the draft at pos 513, accept after
    every non-empty draft. The prompt is one growing list (as_views: a new numpy view at
    every call, so the drafter compares it whole)."""
    toks = stream.tolist()
    ctx: list[int] = []
    out = []
    n = len(toks)
    for pos in range(1, n + 1):
        prompt = stream[:pos - 1] if as_views else ctx
        if begin and pos == 513:
            drafter.begin(prompt)
        d = drafter.draft(prompt, toks[pos - 1]).tolist()
        acc = 0
        while acc < len(d) and pos + acc < n and toks[pos + acc] == d[acc]:
            acc += 1
        if d:
            drafter.accept(acc)
        out.append((pos, d, acc))
        ctx.append(toks[pos - 1])
    return out


@pytest.mark.parametrize("name", sorted(VECTOR_RUNS))
def test_every_draft_of_llama_cpp(drafter_vectors, prose_stream, name):
    header = json.loads((drafter_vectors / "prose.drafters.header.json").read_text())
    meta = header["files"][name + ".jsonl.gz"]
    raw = gzip.decompress((drafter_vectors / (name + ".jsonl.gz")).read_bytes())
    want = [json.loads(line) for line in raw.splitlines()]  # every position; some in the compact copy
    assert meta["lines"] == prose_stream.size
    make, begin = VECTOR_RUNS[name]
    drafter = make()
    got = drive(drafter, prose_stream, begin)
    for w in want:
        pos, d, acc = got[w["pos"] - 1]
        assert (pos, d, acc) == (w["pos"], w["draft"], w["n_accepted"]), f"{name} at pos {pos}"
    # Every position, those the compact copy leaves out too: our rows hash to llama.cpp's file.
    ours = jsonl_bytes({"pos": pos, "draft": d, "n_accepted": acc} for pos, d, acc in got)
    assert hashlib.sha256(ours).hexdigest() == meta["sha256_uncompressed"], \
        f"{name}: drafts differ from llama.cpp's at positions the compact copy leaves out"
    assert sum(1 for _, d, _ in got if d) == meta["positions_with_draft"]
    assert sum(len(d) for _, d, _ in got) == meta["drafted_tokens"]
    if "ngram_mod_low_acceptance_resets" in meta:
        assert drafter.table.resets == meta["ngram_mod_low_acceptance_resets"]


def test_a_new_prompt_object_per_call_drafts_the_same(drafter_vectors, prose_stream):
    # numpy views: the drafter cannot trust them to have only grown and compares them
    name = "prose.ngram-simple.n3m8"
    want = drive(NgramSimple(3, 8), prose_stream[:6000], True)
    assert drive(NgramSimple(3, 8), prose_stream[:6000], True, as_views=True) == want
    assert sum(1 for _, d, _ in want if d) > 500, name


# --- the compiled drafters against the reference's scans -------------------------------

def ref_drive(make_core, make_ref, stream: list, begin_at):
    """Both drafters through the README's loop; the lists of (draft, n_accepted) they gave."""
    core, r = make_core(), make_ref()
    got = [(p, d, a) for p, d, a in drive_list(core, stream, begin_at)]
    want = list(ref.drive(r, stream, begin_at))
    return got, want


def drive_list(drafter, stream: list, begin_at):
    ctx: list[int] = []
    for pos in range(1, len(stream) + 1):
        if begin_at is not None and pos == begin_at + 1:
            drafter.begin(ctx)
        d = drafter.draft(ctx, stream[pos - 1]).tolist()
        acc = 0
        while acc < len(d) and pos + acc < len(stream) and stream[pos + acc] == d[acc]:
            acc += 1
        if d:
            drafter.accept(acc)
        yield pos, d, acc
        ctx.append(stream[pos - 1])


def repetitive(draw, max_len: int = 260):
    """A small-vocabulary stream with copied stretches, so that matches happen."""
    vocab = draw(st.integers(2, 6))
    toks = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=max_len))
    for _ in range(draw(st.integers(0, 4))):
        a = draw(st.integers(0, len(toks) - 1))
        b = draw(st.integers(0, len(toks)))
        toks[b:b] = toks[a:a + draw(st.integers(1, 30))]
    return toks[:max_len]


@st.composite
def streams(draw):
    return repetitive(draw)


def sizes(draw, big: bool = False):
    n = draw(st.integers(1, 4))
    m = draw(st.integers(1, 8))
    return n, m


@settings(max_examples=60, deadline=None)
@given(s=streams(), nm=st.tuples(st.integers(1, 4), st.integers(1, 8)), begin_at=st.none() | st.integers(0, 200))
def test_simple_equals_the_scan(s, nm, begin_at):
    got, want = ref_drive(lambda: NgramSimple(*nm), lambda: ref.NgramSimple(*nm), s, begin_at)
    assert got == want


@settings(max_examples=60, deadline=None)
@given(s=streams(), nm=st.tuples(st.integers(1, 4), st.integers(1, 8)), hits=st.integers(1, 3),
       k4v=st.booleans(), begin_at=st.none() | st.integers(0, 200))
def test_map_equals_the_reference(s, nm, hits, k4v, begin_at):
    got, want = ref_drive(lambda: NgramMapK(*nm, hits, k4v), lambda: ref.NgramMap(*nm, hits, k4v), s, begin_at)
    assert got == want


@settings(max_examples=60, deadline=None)
@given(s=streams(), n=st.integers(1, 6), n_min=st.integers(0, 6), n_max=st.integers(0, 10),
       size=st.sampled_from([1, 7, 64, 4096]), begin_at=st.none() | st.integers(0, 200))
def test_mod_equals_the_reference(s, n, n_min, n_max, size, begin_at):
    # small tables collide and fill up: the 25 % rule and overwrites are exercised
    got, want = ref_drive(lambda: NgramMod(n, n_min, n_max, NgramModTable(size)),
                          lambda: ref.NgramMod(n, n_min, n_max, ref.ModTable(n, size)), s, begin_at)
    assert got == want


@st.composite
def requests(draw):
    """Requests on one drafter: each prompt keeps a prefix of the previous context (or
    not), rewrites a token in it (or not), adds new tokens, then a few generated ones."""
    base = repetitive(draw, 200)
    out = []
    ctx: list[int] = []
    for _ in range(draw(st.integers(1, 4))):
        keep = draw(st.integers(0, len(ctx)))
        prompt = ctx[:keep]
        if prompt and draw(st.booleans()):
            i = draw(st.integers(0, len(prompt) - 1))
            prompt[i] = (prompt[i] + 1) % 7
        a = draw(st.integers(0, len(base) - 1))
        prompt += base[a:a + draw(st.integers(0, 120))]
        gen = base[draw(st.integers(0, len(base) - 1)):][:draw(st.integers(1, 60))]
        out.append((prompt, gen))
        ctx = prompt + gen
    return out


def run_requests(drafter, reqs):
    log = []
    for prompt, gen in reqs:
        drafter.begin(list(prompt))
        ctx = list(prompt)
        for tok in gen:
            d = [int(t) for t in drafter.draft(list(ctx), tok)]
            if d:
                drafter.accept(min(len(d), 1))
            log.append(d)
            ctx.append(tok)
    return log


@settings(max_examples=60, deadline=None)
@given(reqs=requests(), nm=st.tuples(st.integers(1, 3), st.integers(1, 5)), k4v=st.booleans())
def test_rewritten_prompts_equal_the_reference(reqs, nm, k4v):
    # new prompt objects at every call: shrinking, rewritten and regrown histories
    assert run_requests(NgramSimple(*nm), reqs) == run_requests(ref.NgramSimple(*nm), reqs)
    assert run_requests(NgramMapK(*nm, 1, k4v), reqs) == run_requests(ref.NgramMap(*nm, 1, k4v), reqs)
    n = nm[0]
    assert (run_requests(NgramMod(n, 1, 6, NgramModTable(512)), reqs)
            == run_requests(ref.NgramMod(n, 1, 6, ref.ModTable(n, 512)), reqs))


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_real_text_equals_the_reference(prose_stream, data):
    start = data.draw(st.integers(0, prose_stream.size - 800))
    s = prose_stream[start:start + 800].tolist()
    kind = data.draw(st.sampled_from(["simple", "map", "k4v", "mod"]))
    n = data.draw(st.integers(1, 4))
    m = data.draw(st.integers(1, 8))
    if kind == "simple":
        pair = (lambda: NgramSimple(n, m), lambda: ref.NgramSimple(n, m))
    elif kind in ("map", "k4v"):
        pair = (lambda: NgramMapK(n, m, 1, kind == "k4v"), lambda: ref.NgramMap(n, m, 1, kind == "k4v"))
    else:
        pair = (lambda: NgramMod(n, 1, m, NgramModTable(1 << 16)), lambda: ref.NgramMod(n, 1, m, ref.ModTable(n, 1 << 16)))
    got, want = ref_drive(*pair, s, 300)
    assert got == want
    if kind == "simple" and n <= 2 and m >= n:  # size_m < size_n never drafts (copy < size_n)
        assert any(d for _, d, _ in got)


def test_default_sizes_on_real_text_equal_the_reference(prose_stream):
    s = prose_stream[:3000].tolist()
    got, want = ref_drive(lambda: NgramSimple(), lambda: ref.NgramSimple(), s, 512)
    assert got == want and any(d for _, d, _ in got)
    got, want = ref_drive(lambda: NgramMapK(4, 8, 2, True), lambda: ref.NgramMap(4, 8, 2, True), s, 512)
    assert got == want


def test_table_slots_are_llama_cpps():
    t = NgramModTable()
    assert (t.size, t.nbytes, t.used) == (4194304, 16 * 1024 * 1024, 0)
    d = NgramMod(3, 1, 4, t)
    d.begin([5, 6, 7, 8, 9])
    assert t.used == 2
    r = ref.ModTable(3)
    for i in range(2):
        r.add([5, 6, 7, 8, 9][i:i + 4])
    assert t.get([5, 6, 7]) == r.get([5, 6, 7]) == 8
    assert t.get([6, 7, 8]) == 9
    assert t.get([1, 2, 3]) == -1
    assert ref.mod_slot([1], 4194304) == 1
    t.reset()
    assert (t.used, t.resets) == (0, 1)


# --- the Drafter classes -----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["simple", "map", "k4v", "mod"])
def test_drafter_proposes_what_llama_shape_drafts(prose_stream, kind):
    s = prose_stream[:4000].tolist()
    if kind == "simple":
        seq, plain = NgramSimpleDrafter(3, 8, n_draft=5), NgramSimple(3, 8)
    elif kind in ("map", "k4v"):
        seq, plain = NgramMapDrafter(3, 8, 1, kind == "k4v", n_draft=5), NgramMapK(3, 8, 1, kind == "k4v")
    else:
        seq, plain = NgramModDrafter(4, 1, 8, n_draft=5), NgramMod(4, 1, 8)
    assert seq.k4v == (kind == "k4v") if kind in ("map", "k4v") else True
    k = 100
    seq.reset(s[:k])
    plain.begin(s[:k - 1])
    n_drafts = 0
    for i in range(k, len(s)):
        want = plain.draft(s[:i - 1], s[i - 1])[:5]
        got = seq.propose()
        assert got.tolist() == want.tolist(), f"{kind} at {i}"
        if want.size:
            n_drafts += 1
            plain.accept(int(want[0] == s[i]))
        seq.accept([s[i]])
    assert n_drafts > 50


def test_drafters_replay_in_cpp(prose_stream):
    from ngramcache.replays import replay_drafter
    for d in (NgramSimpleDrafter(3, 8), NgramMapDrafter(3, 8), NgramModDrafter(4, 1, 8)):
        r = replay_drafter(prose_stream[:5000], d, 1000, 8)
        assert r.n_drafted > 0 and 0 < r.n_accept <= r.n_drafted


def test_exports():
    assert "speculative" not in vars(nc)  # one name: ngramcache.drafters.llama_ngram
    for name in ("NgramSimpleDrafter", "NgramMapDrafter", "NgramModDrafter"):
        assert name in nc.__all__ and issubclass(getattr(nc, name), nc.drafters.CoreSequenceDrafter)
        assert getattr(nc, name)._SOURCE == 1


# --- arguments ---------------------------------------------------------------------------

@pytest.mark.parametrize("make, exc, text", [
    (lambda: NgramSimple(0), ValueError, "size_n must be 1 to 1024, got 0"),
    (lambda: NgramSimple(12, 1025), ValueError, "size_m must be 1 to 1024"),
    (lambda: NgramSimple("12"), ValueError, "size_n must be an integer"),
    (lambda: NgramSimple(True), ValueError, "size_n must be an integer"),
    (lambda: NgramMapK(12, 48, 0), ValueError, "min_hits must be 1 to 65535"),
    (lambda: NgramMapK(k4v="yes"), TypeError, "k4v must be a bool"),
    (lambda: NgramMod(0), ValueError, "n_match must be 1 to 1024"),
    (lambda: NgramMod(24, -1), ValueError, "n_min must be 0 to 1024"),
    (lambda: NgramMod(24, 48, 2000), ValueError, "n_max must be 0 to 1024"),
    (lambda: NgramMod(table=object()), TypeError, "table must be an NgramModTable"),
    (lambda: NgramModTable(0), ValueError, "size must be 1 to"),
    (lambda: NgramSimpleDrafter(size_m=0), ValueError, "size_m"),
    (lambda: NgramMapDrafter(k4v=1), TypeError, "k4v"),
    (lambda: NgramModDrafter(table="t"), TypeError, "table"),
    (lambda: NgramModDrafter(n_draft=-1), ValueError, "n_draft"),
    # llama.cpp's ngram-mod would never draft with these; the Drafter refuses them
    (lambda: NgramModDrafter(n_min=10, n_max=5), ValueError, r"n_min must be <= n_max \(n_max=5\), got 10"),
    (lambda: NgramModDrafter(n_max=10), ValueError, r"n_min must be <= n_max \(n_max=10\), got 48"),
])
def test_bad_arguments_raise(make, exc, text):
    with pytest.raises(exc, match=text):
        make()


def test_bad_calls_raise():
    d = NgramSimple(2, 2)
    with pytest.raises(ValueError, match="id_last"):
        d.draft([1, 2, 3], -1)
    with pytest.raises(ValueError, match="id_last"):
        d.draft([1, 2, 3], 2**31)
    with pytest.raises(ValueError, match="negative token id -4 at index 1"):
        d.draft([1, -4, 3], 1)
    with pytest.raises(ValueError, match="prompt"):
        d.draft(np.zeros((2, 2), dtype=np.int32), 1)
    with pytest.raises(ValueError, match="n_accepted"):
        d.accept(-1)
    # a growing list whose new tail is bad is rejected too, and nothing changes
    p = [1, 2, 3]
    d.draft(p, 1)
    p.append(-2)
    with pytest.raises(ValueError, match="negative"):
        d.draft(p, 1)
    assert d.n_tokens == 3


def test_prompt_list_grown_cut_and_regrown():
    # the same list object: appended to (the fast path), then cut and regrown (caught by
    # the check of its last seen tokens) -- drafts always equal the scan's
    rng = np.random.default_rng(0)
    base = rng.integers(0, 3, 600).tolist()
    d = NgramSimple(2, 4)
    p: list[int] = []
    for i, tok in enumerate(base):
        if i % 97 == 96:
            del p[len(p) // 2:]
            p.extend(base[:5])
        assert d.draft(p, tok).tolist() == ref.simple_draft(list(p), tok, 2, 4)
        p.append(tok)


# --- one NgramModTable, many threads ------------------------------------------------------

def shared_setup(n: int):
    """A random text repeated, whose windows (with the default table) have one
    continuation per slot: replaying it on a table filled with it rewrites only values
    already there, so every replay drafts the same whatever runs beside it."""
    for seed in range(100):
        r = np.random.default_rng(seed).integers(0, 50, 600)
        s = np.tile(r, 4).astype(np.int32)
        slots = {}
        ok = True
        for i in range(s.size - n):
            k = ref.mod_slot(s[i:i + n].tolist(), ref.MOD_SIZE)
            if slots.setdefault(k, int(s[i + n])) != int(s[i + n]):
                ok = False
                break
        if ok:
            table = NgramModTable()
            NgramMod(n, 1, 16, table).begin(s)
            return s, table
    raise AssertionError("no stream with one continuation per slot")


def test_threads_sharing_a_table_draft_like_one_drafter():
    n = 6
    s, table = shared_setup(n)
    alone = drive(NgramMod(n, 1, 16, table), s, True)
    assert sum(1 for _, d, _ in alone if d) > 100
    results: list = [None] * 8
    errors: list = []

    def work(i):
        try:
            results[i] = drive(NgramMod(n, 1, 16, table), s, True)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(r == alone for r in results)
    assert table.resets == 0


def test_threads_replaying_without_the_gil_share_a_table():
    n = 6
    s, table = shared_setup(n)
    def one():
        r = _core.replay_drafter(NgramModDrafter(n, 1, 16, table=table)._impl, s, 600, 16, None)
        return (r.n_steps, r.n_drafted, r.n_accept)
    alone = one()
    assert alone[1] > 0
    results: list = [None] * 8

    def work(i):
        results[i] = one()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [alone] * 8
    assert table.resets == 0


# --- saving and loading an ngram-mod table ------------------------------------------

def _trained_table(size=4096):
    from ngramcache.drafters.llama_ngram import NgramMod, NgramModTable

    table = NgramModTable(size)
    rng = np.random.default_rng(3)
    phrase = rng.integers(0, 30, 40).astype(np.int32)
    toks = np.concatenate([phrase, rng.integers(0, 30, 20), phrase]).astype(np.int32)
    d = NgramMod(n_match=4, n_min=1, n_max=8, table=table)
    d.begin(toks[:-1])
    d.draft(toks[:-1], int(toks[-1]))
    return table, toks


def test_mod_table_save_load_round_trip(tmp_path):
    from ngramcache.drafters.llama_ngram import NgramMod, NgramModTable

    table, toks = _trained_table()
    assert table.used > 0
    path = tmp_path / "mod.ngmt"
    table.save(path)
    back = NgramModTable.load(path)
    assert (back.size, back.used) == (table.size, table.used)
    assert np.array_equal(back._impl.entries(), table._impl.entries())
    drafts = []
    for t in (table, back):
        d = NgramMod(n_match=4, n_min=1, n_max=8, table=t)
        d.begin(toks[:44])
        drafts.append(d.draft(toks[:44], int(toks[44])).tolist())
    assert drafts[0] == drafts[1] and drafts[0]


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:10], "truncated"),
    (lambda b: b"XXXX" + b[4:], "not an ngram-mod table"),
    (lambda b: b[:200] + bytes([b[200] ^ 4]) + b[201:], "checksum"),
    (lambda b: b[:-8], "do not hold"),
])
def test_mod_table_load_rejects_damaged_files(tmp_path, damage, message):
    from ngramcache.drafters.llama_ngram import NgramModTable

    path = tmp_path / "mod.ngmt"
    _trained_table()[0].save(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(nc.CacheFormatError, match=message):
        NgramModTable.load(path)


def test_mod_table_load_rejects_a_slot_that_is_not_a_token(tmp_path):
    import struct
    import zlib

    from ngramcache.drafters.llama_ngram import NgramModTable

    path = tmp_path / "mod.ngmt"
    NgramModTable(16).save(path)
    body = bytearray(path.read_bytes()[:-4])
    body[16 + 4 * 3 : 16 + 4 * 4] = struct.pack("<i", -7)
    path.write_bytes(bytes(body) + struct.pack("<I", zlib.crc32(bytes(body))))
    with pytest.raises(nc.CacheFormatError, match="slot 3 holds -7"):
        NgramModTable.load(path)
    with pytest.raises(FileNotFoundError):
        NgramModTable.load(tmp_path / "missing.ngmt")
