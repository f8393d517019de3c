"""Each default and bound is declared once (ngramcache.defaults, each drafter's OPTIONS), and
where the compiled core declares its own (its constructors' keyword defaults, the replay's
bound, the option ranges) the two agree; the command line, the server and hf read theirs
from the one place."""

from __future__ import annotations

import inspect

import pytest

from ngramcache import _core, defaults
from ngramcache.cli.main import main as cli_main
from ngramcache.drafters import registry
from ngramcache.drafters.llama_ngram import SIZE_MAX, NgramMapK, NgramMod, NgramModTable, NgramSimple
from ngramcache.drafters.prompt_lookup import PROMPT_LOOKUP_MAX_NGRAM
from ngramcache.drafters.suffix import SUFFIX_MAX_DEPTH, SuffixStore
from ngramcache._validate import NGRAM_MAX

CORE = _core.defaults()

# An option whose core keyword has another name or type: PromptLookupDrafter's match is the
# core's recent (match="recent" is recent=True).
RENAMED = {("PromptLookupDrafter", "match"): ("recent", lambda value: value == "recent")}


def _core_name(drafter) -> str:
    return type(drafter._impl).__name__


@pytest.mark.parametrize("name", [s.name for s in registry.specs()])
def test_every_drafter_option_default_is_the_cores(name):
    """Each registered drafter's options default to what the core's constructor does, and
    every keyword default of that constructor is one of its options: no default is kept
    in one place only."""
    spec = registry.spec(name)
    drafter = registry.make_drafter(name)
    core = CORE[_core_name(drafter)]
    checked = set()
    for option in spec.cls.OPTIONS:
        keyword, convert = RENAMED.get((_core_name(drafter), option.name), (option.name, lambda v: v))
        assert keyword in core, f"{name}: option {option.name} has no keyword default in the core"
        assert convert(option.default) == core[keyword], (name, option.name)
        checked.add(keyword)
    shared = {k for k, v in core.items() if v is None}  # shared state: None unless given
    assert set(core) - shared == checked, f"{name}: core defaults the package does not declare"


@pytest.mark.parametrize("cls", [NgramSimple, NgramMapK, NgramMod, NgramModTable, SuffixStore])
def test_the_other_compiled_objects_default_as_the_core(cls):
    """The llama.cpp-shaped drafters, the ngram-mod table and the suffix store: their
    constructors' defaults are the core's."""
    core = CORE[type(cls()._impl).__name__]
    params = inspect.signature(cls).parameters
    for keyword, value in core.items():
        if value is not None:
            assert params[keyword].default == value, (cls.__name__, keyword)


def test_the_cores_bounds_are_the_packages():
    limits = _core.limits()
    assert limits == {"max_replay_draft": defaults.MAX_REPLAY_DRAFT, "ngram_max": NGRAM_MAX,
                      "spec_size_max": SIZE_MAX, "prompt_lookup_max_ngram": PROMPT_LOOKUP_MAX_NGRAM,
                      "suffix_max_depth": SUFFIX_MAX_DEPTH}


def test_the_core_reports_a_copy():
    d = _core.defaults()
    d["CopyDrafter"]["min_match"] = -1
    assert _core.defaults()["CopyDrafter"]["min_match"] == CORE["CopyDrafter"]["min_match"] != -1


def test_the_bounds_nest():
    # decoding drafts no more than a replay can count, and a replay no more than a drafter may hold
    assert 0 < defaults.MAX_DECODE_DRAFT < defaults.MAX_REPLAY_DRAFT < defaults.MAX_DRAFT
    for n in (defaults.N_DRAFT, defaults.HF_N_DRAFT, defaults.STATS_N_DRAFT):
        assert 0 < n <= defaults.MAX_DECODE_DRAFT


def _parse(argv):
    """The flags of a command, parsed as its run() gets them."""
    from ngramcache.cli.main import build_parser

    return build_parser().parse_args(argv)


@pytest.mark.parametrize("argv,default,highest", [
    (["generate", "-p", "x"], defaults.N_DRAFT, defaults.MAX_DECODE_DRAFT),
    (["demo"], defaults.N_DRAFT, defaults.MAX_DECODE_DRAFT),
    (["chat"], defaults.N_DRAFT, defaults.MAX_DECODE_DRAFT),
    (["serve"], defaults.N_DRAFT, defaults.MAX_DECODE_DRAFT),
    (["stats", "--tokens", "t.i32"], defaults.STATS_N_DRAFT, defaults.MAX_REPLAY_DRAFT),
])
def test_each_command_takes_its_draft_length_from_the_one_place(argv, default, highest):
    args = _parse(argv)
    assert args.n_draft == default
    assert args.draft_length_range[1] == highest


@pytest.mark.parametrize("cmd,highest", [("generate", defaults.MAX_DECODE_DRAFT), ("chat", defaults.MAX_DECODE_DRAFT),
                                         ("stats", defaults.MAX_REPLAY_DRAFT)])
def test_a_draft_length_past_the_bound_is_a_usage_error_naming_it(cmd, highest, capsys):
    argv = {"generate": ["generate", "-p", "x"], "chat": ["chat"], "stats": ["stats", "--tokens", "none.i32"]}[cmd]
    rc = cli_main(argv + ["--spec-draft-n-max", str(highest + 1)])
    err = capsys.readouterr().err
    assert rc == 2 and f"--spec-draft-n-max must be 0 to {highest}, got {highest + 1}" in err


def test_the_server_and_make_drafter_default_to_the_one_place():
    from ngramcache.serving.engine import Engine

    assert inspect.signature(Engine).parameters["n_draft"].default == defaults.N_DRAFT
    assert inspect.signature(registry.make_drafter).parameters["n_draft"].default == defaults.N_DRAFT
    assert registry.make_drafter("copy").n_draft == defaults.N_DRAFT


def test_hf_defaults_to_its_own_named_length():
    from ngramcache.integrations import hf_costs

    assert inspect.signature(hf_costs.adaptive_drafter).parameters["n_draft"].default == defaults.HF_N_DRAFT
