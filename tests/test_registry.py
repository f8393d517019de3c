"""The drafter registry: a drafter registered through a spec alone is found by the catalog,
the command line (its flags and stats' replay), the server's request checks and memory
wiring, and Hugging Face generate; the specs' checks; the options table of docs/drafters.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ngramcache.cli.main import main as cli_main
from ngramcache.drafters import registry
from ngramcache.drafters.base import Proposal, SequenceDrafter, Source
from ngramcache.drafters.catalog import DRAFTERS, drafter_class, make_drafter
from ngramcache.drafters.options import Option, OptionError, UnknownOptionError
from ngramcache.replays import replay_drafter
from support import prompt_ids, python_replay, tiny_model

DOCS = Path(__file__).resolve().parent.parent / "docs" / "drafters.md"


class CountingDrafter(SequenceDrafter):
    """Proposes the counting pattern: after token t, (t + 1) % period, (t + 2) % period, ..."""

    OPTIONS = (Option("period", int, 3, "length of the counting pattern", lo=1, hi=100),
               Option("step", int, 1, "how far each proposed token counts on", lo=1, hi=100))
    made: list = []

    def __init__(self, period: int = 3, step: int = 1, n_draft: int = 16, dynamic=None):
        super().__init__(n_draft)
        self._set_options(period=period, step=step)
        self.dynamic = dynamic
        CountingDrafter.made.append(self)

    def _candidates(self, n: int):
        last = int(self.tokens[-1]) if self.tokens.size else -1
        return Proposal(((last + self.step * np.arange(1, n + 1)) % self.period).astype(np.int32), n, Source.COPY)


def counting_text(n: int, period: int = 3) -> np.ndarray:
    return (np.arange(n) % period).astype(np.int32)


@pytest.fixture
def toy():
    """The toy drafter, registered for one test and removed after it."""
    CountingDrafter.made.clear()
    spec = registry.register(registry.DrafterSpec(
        "toy", "the counting pattern (a test drafter)", CountingDrafter, fixed={"step": 1},
        shared_state=(registry.Shared(registry.DYNAMIC, "dynamic"),)))
    yield spec
    registry.unregister("toy")
    assert "toy" not in DRAFTERS


# --- the catalog ------------------------------------------------------------------------

def test_a_registered_drafter_is_in_the_catalog(toy):
    assert list(DRAFTERS)[-1] == "toy" and DRAFTERS["toy"] == toy.description
    assert drafter_class("toy") is CountingDrafter
    d = make_drafter("toy", n_draft=5, period=4)
    assert (d.period, d.step, d.n_draft) == (4, 1, 5)
    d.reset([2])
    assert d.propose().tolist() == [3, 0, 1, 2, 3]
    assert registry.name_of(d) == "toy"
    assert registry.name_of(CountingDrafter(step=2)) is None  # another step is not the spec's drafter
    with pytest.raises(TypeError, match=r"'toy' takes no option step \(its options: dynamic, period\)"):
        make_drafter("toy", step=2)
    with pytest.raises(ValueError, match="period must be 1 to 100, got 0"):
        make_drafter("toy", period=0)


def test_unregistered_it_is_gone():
    assert "toy" not in DRAFTERS
    with pytest.raises(ValueError, match="unknown drafter 'toy': choose one of copy, suffix"):
        make_drafter("toy")


# --- the command line -------------------------------------------------------------------

def test_generate_help_lists_it_and_its_options(toy, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["generate", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(r"--drafter NAME .*: copy, suffix, [a-z0-9, -]*\btoy \(default: copy", out)
    assert "--toy-period N toy: length of the counting pattern (1-100; default 3)" in out
    assert "--toy-step" not in out  # fixed by the spec


def test_stats_replays_it(toy, tmp_path, capsys):
    tokens = counting_text(3000)
    path = tmp_path / "count.i32"
    tokens.tofile(path)
    argv = ["stats", "--tokens", str(path), "-c", "500", "--spec-draft-n-max", "6", "--drafter", "toy", "--json",
            "-q"]
    assert cli_main(argv + ["--toy-period", "3"]) == 0
    got = json.loads(capsys.readouterr().out)
    want = python_replay(CountingDrafter(period=3, n_draft=6), tokens, 500, 6)
    assert got["drafter"] == "toy"
    assert {k: got[k] for k in want} == want
    assert got["n_accept"] > 0.9 * got["n_drafted"]  # the text is the pattern
    # another period: the option reaches the drafter
    assert cli_main(argv + ["--toy-period", "4"]) == 0
    other = json.loads(capsys.readouterr().out)
    want = python_replay(CountingDrafter(period=4, n_draft=6), tokens, 500, 6)
    assert {k: other[k] for k in want} == want and other["n_accept"] < got["n_accept"]
    assert cli_main(argv + ["--toy-period", "0"]) == 2
    assert "--drafter toy: --toy-period must be 1 to 100, got 0" in capsys.readouterr().err
    assert cli_main(argv[:-2] + ["--drafter", "pld", "--toy-period", "3", "-q"]) == 2
    assert "--toy-period applies to --drafter toy, not pld" in capsys.readouterr().err


def test_replay_of_a_python_drafter_ignores_its_gate_and_n_draft_and_reports_progress(toy):
    from ngramcache.decoding.gate import Gate, GatedDrafter

    tokens = counting_text(250_001)
    d = GatedDrafter(make_drafter("toy", n_draft=2), Gate([1.0] + [5.0] * 8))
    calls = []
    st = replay_drafter(tokens, d, 125_000, 8, progress=lambda done, total: calls.append((done, total)))
    assert st.n_accept == st.n_drafted - 2  # every proposal is right, but the last of each chunk overruns it
    assert max(st.drafted_by_position[7:]) > 0  # 8 tokens proposed although the drafter's n_draft is 2
    assert calls[-1] == (250_000, 250_000) and len(calls) >= 3
    assert d.n_draft == 2  # restored


    def stop(done, total):
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        replay_drafter(tokens, d, 125_000, 8, progress=stop)
    assert d.n_draft == 2


# --- the server -------------------------------------------------------------------------

def test_a_request_may_name_it(toy):
    from ngramcache.serving.drafting import resolve_speculative
    from ngramcache.serving.errors import RequestError

    plan = resolve_speculative({"drafter": "toy", "n_draft": 4}, "copy", 16)
    assert tuple(plan)[:2] == ("toy", 4)
    assert toy.validate_options({"period": 5}) == {"period": 5}
    with pytest.raises(OptionError) as e:
        toy.validate_options({"period": "5"})
    assert e.value.param == "period"
    with pytest.raises(UnknownOptionError) as e:
        toy.validate_options({"step": 2})
    assert e.value.param == "step"
    registry.unregister("toy")
    try:
        with pytest.raises(RequestError, match="toy"):
            resolve_speculative({"drafter": "toy"}, "copy", 16)
    finally:
        registry.register(toy)


def test_the_servers_memory_gives_it_the_state_it_names(toy):
    from ngramcache.serving.memory import Memory

    mem = Memory(max_tokens=1000, mod_size=64)
    assert mem.drafter_options("toy") == {"dynamic": mem.dynamic}
    available = {registry.DYNAMIC: mem.dynamic, registry.MOD_TABLE: mem.mod}
    assert toy.shared_kwargs(available) == {"dynamic": mem.dynamic}
    assert make_drafter("toy", **toy.shared_kwargs(available)).dynamic is mem.dynamic


# --- Hugging Face -------------------------------------------------------------------------

def test_hf_generate_drafts_with_it_by_name(toy, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ngramcache.integrations import hf

    monkeypatch.setenv("NGRAMCACHE_CACHE_DIR", str(tmp_path))
    model = tiny_model(sharpen=8.0)
    ids = prompt_ids()
    plain = model.generate(ids, do_sample=False, max_new_tokens=16)
    out = hf.generate(model, ids, drafter="toy", max_new_tokens=16, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain)
    assert [type(d) for d in CountingDrafter.made] == [CountingDrafter]
    assert out.drafting.steps > 0


# --- declaring a spec ---------------------------------------------------------------------

def test_bad_specs_are_refused(toy):
    with pytest.raises(ValueError, match="registered already"):
        registry.register(registry.DrafterSpec("toy", "again", CountingDrafter))
    with pytest.raises(ValueError, match="--toy-period belongs to drafter 'toy'"):
        registry.register(registry.DrafterSpec("toy2", "clash", CountingDrafter, flag_prefix="--toy-"))
    with pytest.raises(ValueError, match="period must be 1 to 100"):
        registry.DrafterSpec("toy3", "bad fixed value", CountingDrafter, fixed={"period": 0})
    with pytest.raises(TypeError, match="no option|not an option"):
        registry.DrafterSpec("toy3", "unknown fixed option", CountingDrafter, fixed={"colour": 1})
    with pytest.raises(ValueError, match="shared state kind"):
        registry.Shared("tape", "tape")
    with pytest.raises(ValueError, match="letters, digits and dashes"):
        registry.DrafterSpec("two words", "bad name", CountingDrafter)
    with pytest.raises(TypeError, match="DrafterSpec"):
        registry.register(CountingDrafter)
    assert registry.spec("toy") is toy  # nothing above replaced it
    assert registry.register(registry.DrafterSpec("toy", "replaced", CountingDrafter), replace=True).fixed == {}


def test_every_builtin_option_is_what_its_constructor_defaults_to():
    import inspect

    for s in registry.specs():
        params = inspect.signature(s.cls).parameters
        for o in s.options:
            assert params[o.name].default == o.default, (s.name, o.name)
        d = s.make(n_draft=3)
        assert {o.name: getattr(d, o.name) for o in s.options} == {o.name: o.default for o in s.options}
        assert registry.name_of(d) == s.name


def test_builtin_shared_state():
    kinds = {s.name: {(x.kind, x.keyword, x.writes) for x in s.shared_state} for s in registry.specs()}
    assert kinds["copy"] == kinds["lookup"] == {("dynamic", "dynamic", False), ("static", "static", False)}
    assert kinds["suffix"] == {("suffix_store", "store", True)}
    assert kinds["mod"] == {("mod_table", "table", True)}
    assert kinds["simple"] == kinds["pld"] == set()
    assert set(registry.shared_state_kinds()) == {"dynamic", "static", "suffix_store", "mod_table"}


# --- docs -----------------------------------------------------------------------------------

def test_docs_embed_the_options_table():
    text = DOCS.read_text(encoding="utf-8")
    m = re.search(r"<!-- options table: begin.*?-->\n(.*?)<!-- options table: end -->", text, re.S)
    assert m, "docs/drafters.md has no options table markers"
    assert m.group(1) == registry.options_table(), (
        "docs/drafters.md's options table is stale: python -m ngramcache.drafters docs/drafters.md")


# --- a compiled drafter: one registry entry over its core class ----------------------------

def test_a_compiled_drafter_is_one_registry_entry(capsys):
    """DrafterSpec.compiled over a core class (here ngram-simple's) is a drafter like the
    built-in one: the same proposals, replayed in C++, its options checked and on the
    command line, its defaults the core's."""
    import inspect

    from ngramcache import _core
    from ngramcache.drafters.llama_ngram import SIMPLE_OPTIONS, NgramSimpleDrafter

    spec = registry.DrafterSpec.compiled("simple-again", "ngram-simple, through the generic wrapper",
                                         _core.NgramSimpleSequence, options=SIMPLE_OPTIONS)
    registry.register(spec)
    try:
        d = make_drafter("simple-again", n_draft=6, size_n=3, size_m=16)
        assert type(d._impl) is _core.NgramSimpleSequence and (d.size_n, d.size_m) == (3, 16)
        assert registry.name_of(d) == "simple-again" and d.n_draft == 6
        rng = np.random.default_rng(5)
        phrase = rng.integers(0, 200, 40).astype(np.int32)
        toks = np.concatenate([phrase, rng.integers(0, 200, 7), phrase, phrase[:20], rng.integers(0, 200, 9),
                               phrase] * 20).astype(np.int32)
        want = python_replay(NgramSimpleDrafter(size_n=3, size_m=16, n_draft=6), toks, 500, 6)
        assert python_replay(d, toks, 500, 6) == want and want["n_accept"] > 0
        st = replay_drafter(toks, make_drafter("simple-again", n_draft=6, size_n=3, size_m=16), 500, 6)
        assert (st.drafter, st.n_accept, st.n_drafted) == ("simple-again", want["n_accept"], want["n_drafted"])
        defaults = make_drafter("simple-again")
        assert (defaults.size_n, defaults.size_m) == tuple(_core.defaults()["NgramSimpleSequence"].values())
        params = inspect.signature(spec.cls).parameters  # what help() shows
        assert list(params) == ["n_draft", "size_n", "size_m"] and params["size_m"].default == defaults.size_m
        with pytest.raises(OptionError, match="size_n"):
            make_drafter("simple-again", size_n=0)
        with pytest.raises(UnknownOptionError):
            make_drafter("simple-again", min_hits=2)
        with pytest.raises(SystemExit):
            cli_main(["generate", "--help"])
        assert "--simple-again-size-n" in capsys.readouterr().out
    finally:
        registry.unregister("simple-again")
