"""Replays the committed fuzz corpus and crashers (fuzz/corpus/, fuzz/crashers/) through
the Python-level fuzz targets (fuzz/targets.py): every file must meet its target's
acceptable-outcome rule. The C++ harnesses' own files also go through the Python API
(``cache_files``); CTest replays them through the C++ harnesses themselves."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parent.parent / "fuzz"
sys.path.insert(0, str(FUZZ))

import targets  # noqa: E402

# The C++ harnesses' corpora are cache files too.
EXTRA = {"cache_files": ("lookup", "ngst")}


def cases():
    for target in targets.TARGETS:
        for folder in (target, *EXTRA.get(target, ())):
            for kind in ("corpus", "crashers"):
                d = FUZZ / kind / folder
                if d.is_dir():
                    for f in sorted(d.iterdir()):
                        yield pytest.param(target, f, id=f"{target}:{kind}/{folder}/{f.name}")


def test_every_target_has_a_corpus():
    for target in (*targets.TARGETS, "lookup", "ngst"):
        assert any((FUZZ / "corpus" / target).iterdir()), target


@pytest.mark.parametrize("target, path", list(cases()))
def test_replay(target, path):
    targets.TARGETS[target](path.read_bytes())


def test_the_cli_target_reports_what_escapes_main(monkeypatch):
    # What the target exists to catch: an exception main() does not turn into a status.
    import ngramcache.cli.info as info

    def broken(args):
        raise KeyError("escaped")

    monkeypatch.setattr(info, "run", broken)
    with pytest.raises(KeyError, match="escaped"):
        targets.cli(targets.cli_input(["info", "good.bin"]))


def test_the_cli_target_requires_a_one_line_error(monkeypatch):
    import ngramcache.cli.info as info

    def silent_failure(args):
        return 1

    monkeypatch.setattr(info, "run", silent_failure)
    with pytest.raises(targets.Finding, match="one-line error"):
        targets.cli(targets.cli_input(["info", "good.bin"]))


def test_the_cli_target_leaves_the_model_loaders_alone():
    # The target stops runs where a model would load; the tests after it load real models.
    import ngramcache.models
    import ngramcache.corpus.tokenizers
    loaders = ngramcache.models.model_path, ngramcache.corpus.tokenizers.load_tokenizer
    targets.cli(targets.cli_input(["stats", "-m", "smollm2", "-f", "text.txt"]))
    assert (ngramcache.models.model_path, ngramcache.corpus.tokenizers.load_tokenizer) == loaders
