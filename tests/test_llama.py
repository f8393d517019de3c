"""The llama-cpp-python side without a model: LlamaDrafter (llama-cpp-python's draft-model
interface over a Drafter) and the on-disk store of calibrated verification costs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import PROMPT, reference
from ngramcache import DraftStats, LookupDrafter
from ngramcache.integrations.llama import LlamaDrafter, load_costs, store_costs


# --- LlamaDrafter: prefix detection ----------------------------------------------------

class Recorder:
    def __init__(self):
        self.calls = []
        self._stats = DraftStats()
        self.n_draft = 3

    @property
    def stats(self):
        return self._stats

    def reset(self, prompt_tokens):
        self.calls.append(("reset", list(np.asarray(prompt_tokens).tolist())))

    def propose(self, n_max):
        self.calls.append(("propose", n_max))
        return np.array([7, 8, 9][:n_max], dtype=np.int32)

    def accept(self, tokens):
        self.calls.append(("accept", list(np.asarray(tokens).tolist())))


def test_adapter_detects_new_and_rewound_tokens():
    rec = Recorder()
    ad = LlamaDrafter(rec)
    buf = np.zeros(64, dtype=np.intc)  # llama-cpp-python passes views of one buffer
    buf[:4] = [1, 2, 3, 4]
    out = ad(buf[:4])
    assert out.dtype == np.intc and out.tolist() == [7, 8, 9]
    buf[4:7] = [7, 8, 5]  # two drafts accepted, then the model's own token
    ad(buf[:7])
    buf[7] = 6
    ad(buf[:8])
    ad(buf[:8])  # nothing new
    buf[:3] = [1, 2, 99]  # a new request sharing only a prefix
    ad(buf[:5])
    assert rec.calls == [
        ("reset", [1, 2, 3, 4]), ("propose", 3),
        ("accept", [7, 8, 5]), ("propose", 3),
        ("accept", [6]), ("propose", 3),
        ("propose", 3),
        ("reset", [1, 2, 99, 4, 7]), ("propose", 3),
    ]
    assert ad.resets == 1


def test_adapter_feeds_lookup_drafter_incrementally():
    seq = reference(PROMPT, 300)
    full = np.asarray(PROMPT + seq, dtype=np.intc)
    a = LlamaDrafter(LookupDrafter(n_draft=4))
    b = LookupDrafter(n_draft=4)
    b.reset(full[: len(PROMPT)])
    n = len(PROMPT)
    first = True
    while n < full.size:
        got = a(full[:n])
        if not first:
            b.accept(full[prev:n])
        first = False
        want = b.propose(4)
        assert got.tolist() == want.tolist()
        prev = n
        n += 1 + (n % 3)
    assert a.resets == 0


@pytest.mark.parametrize("name", ["copy", "suffix", "simple", "map-k", "map-k4v", "mod", "pld"])
def test_adapter_feeds_every_drafter_incrementally(name):
    from ngramcache.drafters.catalog import make_drafter

    opts = {"simple": {"size_n": 2, "size_m": 8}, "map-k": {"size_n": 2, "size_m": 8},
            "map-k4v": {"size_n": 2, "size_m": 8}, "mod": {"n_match": 2, "n_min": 1, "n_max": 8}}.get(name, {})
    seq = reference(PROMPT, 300)
    full = np.asarray(PROMPT + seq, dtype=np.intc)
    a = LlamaDrafter(make_drafter(name, n_draft=4, **opts))
    b = make_drafter(name, n_draft=4, **opts)
    b.reset(full[: len(PROMPT)])
    n, prev, proposed = len(PROMPT), None, 0
    while n < full.size:
        got = a(full[:n])
        if prev is not None:
            b.accept(full[prev:n])
        want = b.propose(4)
        assert got.tolist() == want.tolist()
        proposed += want.size
        prev = n
        n += 1 + (n % 3)
    assert a.resets == 0
    assert proposed > 0


def test_follower_counts_drafted_and_accepted_tokens_and_grows_with_the_sequence():
    from ngramcache.integrations.follower import SequenceFollower

    rec = Recorder()
    f = SequenceFollower(rec)
    seq = list(range(2000))
    f.follow(seq[:10])
    f.handed_out([10, 11, 99])  # two right, then a wrong one
    f.follow(seq[:13])  # the verifier kept 10, 11 and chose 12 itself
    assert (f.drafted, f.accepted) == (3, 2)
    f.handed_out([13, 14])
    f.follow(seq[:16])  # all accepted, plus the model's own token
    f.handed_out([])
    f.follow(seq[:1500])  # past the first buffer
    assert (f.drafted, f.accepted, f.resets, len(f)) == (5, 4, 0, 1500)
    assert rec.calls[-1] == ("accept", seq[16:1500])
    f.handed_out([7])
    f.follow(seq[:1200] + [5])  # a rewind: restarts the drafter; its pending draft is not scored
    assert (f.drafted, f.resets) == (5, 1) and rec.calls[-1] == ("reset", seq[:1200] + [5])
    f.forget()
    f.follow(seq[:3])
    assert f.resets == 1 and rec.calls[-1] == ("reset", seq[:3])  # forgotten: no rewind counted
    with pytest.raises(ValueError, match="input_ids"):
        f.follow([1, -2])


def test_adapter_rejects_non_drafters():
    with pytest.raises(TypeError):
        LlamaDrafter(object())
    with pytest.raises(ValueError):
        LlamaDrafter(LookupDrafter(), n_max=-2)


# --- the cost store --------------------------------------------------------------------

def test_costs_are_kept_on_disk(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 10)
    cache = tmp_path / "c" / "costs.json"
    assert load_costs(str(model), 2, 2, str(cache)) is None
    store_costs(str(model), 2, 2, [0.01, 0.012], str(cache))
    store_costs(str(model), 1, 2, [0.02, 0.03], str(cache))
    assert load_costs(str(model), 2, 2, str(cache)) == [0.01, 0.012]
    assert load_costs(str(model), 1, 2, str(cache)) == [0.02, 0.03]
    model.write_bytes(b"y" * 11)  # a different file: recalibrate
    assert load_costs(str(model), 2, 2, str(cache)) is None
    cache.write_text("{not json")
    assert load_costs(str(model), 2, 2, str(cache)) is None
    store_costs(str(model), 2, 2, [0.5], str(cache))  # a damaged file is replaced
    assert json.loads(cache.read_text())
    assert [p.name for p in cache.parent.iterdir()] == ["costs.json"]


def test_cost_key_names_the_backend_build_and_kernels(tmp_path):
    from ngramcache.integrations.llama import _cost_key
    from ngramcache.integrations.llama_costs import cost_key

    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    key = cost_key(str(model), 2, 3)
    assert key.backend == "llama.cpp" and key.threads == "t2|tb3" and str(model) in key.model
    assert "repack 0" in key.build and cost_key(str(model), 2, 3, weight_repacking=True) != key
    assert _cost_key(str(model), 2, 3) == str(key)
    cache = tmp_path / "costs.json"
    store_costs(str(model), 2, 3, [0.5, 0.6], str(cache), weight_repacking=True)
    assert load_costs(str(model), 2, 3, str(cache)) is None  # measured with other kernels
    assert load_costs(str(model), 2, 3, str(cache), weight_repacking=True) == [0.5, 0.6]


@pytest.mark.parametrize("damage", ['{"KEY": [{"a": 1}]}', '{"KEY": [0.1, [0.2]]}', "[" * 100_000])
def test_a_damaged_cost_store_is_ignored_then_replaced(tmp_path, damage):
    from ngramcache.integrations.llama import _cost_key

    model = tmp_path / "m.gguf"
    model.write_bytes(b"x")
    cache = tmp_path / "costs.json"
    cache.write_text(damage.replace("KEY", _cost_key(str(model), 2, 2)))
    assert load_costs(str(model), 2, 2, str(cache)) is None
    store_costs(str(model), 2, 2, [0.5, 0.6], str(cache))
    assert load_costs(str(model), 2, 2, str(cache)) == [0.5, 0.6]


@pytest.mark.parametrize("env,exact,expect", [(None, None, True), ("0", None, False), ("1", None, True),
                                              ("0", True, True), (None, False, False)])
def test_exact_kernels_are_the_default_unless_switched_off(monkeypatch, env, exact, expect):
    import llama_cpp

    from ngramcache.integrations import exactness

    calls = []
    monkeypatch.setattr(exactness, "exact_kernels", lambda: calls.append("kernels"))
    monkeypatch.setattr(exactness, "no_weight_repacking", lambda: _Recorder(calls))
    monkeypatch.setattr(llama_cpp, "Llama", lambda **kw: kw)
    if env is None:
        monkeypatch.delenv("NGRAMCACHE_EXACT", raising=False)
    else:
        monkeypatch.setenv("NGRAMCACHE_EXACT", env)
    import ngramcache.integrations.llama as nl

    kw = nl.make_llama("smollm2", exact=exact)
    assert kw["n_ctx"] == 4096
    assert calls == (["kernels", "no repacking"] if expect else [])


class _Recorder:
    def __init__(self, calls):
        self.calls = calls

    def __enter__(self):
        self.calls.append("no repacking")

    def __exit__(self, *exc):
        return False
