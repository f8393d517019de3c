"""`ngramcache demo`: plain decoding, llama-cpp-python's prompt lookup and ngramcache side
by side; llama.cpp's -p/-f prompt rules (fake model) and a short real run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import PROMPT_CASES, _prompt_argv, run_cli


@pytest.mark.parametrize("flags, content, want", PROMPT_CASES)
def test_demo_prompt_rules(tmp_path, capsys, fake_llama, flags, content, want):
    seen, model = fake_llama
    rc, out, err = run_cli(capsys, "demo", "-m", model, "--repeats", "1", "-n", "8", "-q",
                           *_prompt_argv(tmp_path, flags, content))
    assert rc == 0, err
    assert err == ""  # -q: no progress lines
    warm, runs = seen[:2], seen[2:]
    assert warm == [want[:200]] * 2 and runs == [want] * 3  # plain, llama-cpp, ngramcache
    lines = out.splitlines()
    assert lines[0] == "" and lines[1].split() == ["method", "gen", "tok/s", "speedup", "e2e", "tok/s", "e2e",
                                                   "speedup", "prompt", "s", "drafted", "accepted", "accept", "%",
                                                   "identical"]
    assert [ln.split()[0] for ln in lines[3:6]] == ["plain", "llama-cpp", "ngramcache"]
    assert all(ln.split()[-1] == "yes" for ln in lines[3:6])
    assert "ngramcache's output (1 lines; first 1):" in out


@pytest.mark.model
def test_cli_demo_small(gemma_path, capsys):
    from ngramcache.cli.main import main

    rc = main(["demo", "-n", "24", "--repeats", "1", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["method"]: r for r in out["methods"]}
    assert set(rows) == {"plain", "llama-cpp", "ngramcache"}
    # the packaged model is exact on this build: every drafting method gives plain greedy's text
    assert out["exactness"]["exact"] is True and out["exactness"]["measured"] is True
    assert out["exactness"]["rows_equal"] == out["exactness"]["rows"] == 48
    assert rows["ngramcache"]["identical"] and rows["llama-cpp"]["identical"]
    assert rows["ngramcache"]["first_difference"] is None
    assert all("bit for bit" in note for note in out["notes"]) and len(out["notes"]) == 2
    assert rows["ngramcache"]["accepted"] > 0
    assert out["prompt_source"] == "a type-hints task (shipped with ngramcache)"


@pytest.mark.model
def test_demo_compares_with_your_llama_cpp_python(gemma_path, capsys, monkeypatch):
    # a folder holding a llama_cpp package stands for the default build: here the installed
    # one, run in a child process with llama-cpp-python's own loading (NGRAMCACHE_EXACT=0)
    import llama_cpp

    from ngramcache.cli.main import main

    monkeypatch.setenv("NGRAMCACHE_DEFAULT_BUILD", str(Path(llama_cpp.__file__).parent.parent))
    rc = main(["demo", "-n", "16", "--repeats", "1", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["method"]: r for r in out["methods"]}
    yours = rows["your llama-cpp-python"]
    assert yours["tokens"] == 16 and yours["drafted"] == 0 and yours["identical"] is None
    assert yours["vs_yours"] == 1.0
    for r in rows.values():  # every row's end to end over the baseline's
        assert r["vs_yours"] == round(r["e2e_tok_s"] / yours["e2e_tok_s"], 3)


def test_demo_says_how_to_get_your_figure(capsys, fake_llama, tmp_path):
    seen, model = fake_llama
    rc, out, err = run_cli(capsys, "demo", "-m", model, "--repeats", "1", "-n", "8", "-p", "hello there")
    assert rc == 0, err
    assert "your llama-cpp-python: not measured; bench/build_default_llama.sh" in err
    assert "vs yours" not in out


def _result(tokens, gen, e2e):
    from types import SimpleNamespace
    return SimpleNamespace(tokens=np.array(tokens, dtype=np.int32), n_tokens=len(tokens), gen_tokens_per_s=gen,
                           e2e_tokens_per_s=e2e, t_prompt=0.1, drafted=4, accepted=3)


def test_demo_summary_medians_ranges_and_first_difference():
    from ngramcache.cli.demo import summarise, table_columns

    runs = {"plain": [_result([1, 2, 3], 10.0, 8.0), _result([1, 2, 3], 12.0, 9.0), _result([1, 2, 3], 11.0, 7.0)],
            "llama-cpp": [_result([1, 2, 3], 20.0, 9.0)] * 3,
            "ngramcache": [_result([1, 2, 3], 30.0, 10.0), _result([1, 5, 6], 33.0, 11.0),
                           _result([1, 2, 3], 29.0, 12.0)]}
    rows = {r["method"]: r for r in summarise(runs, 40, {0: 3.5, 1: 0.0213, 2: 1.0})}
    assert rows["plain"]["gen_tok_s"] == 11.0 and rows["plain"]["gen_tok_s_range"] == [10.0, 12.0]
    assert rows["plain"]["e2e_tok_s_range"] == [7.0, 9.0]
    assert rows["ngramcache"]["gen_tok_s"] == 30.0 and rows["ngramcache"]["gen_speedup"] == 2.727  # 30 / 11
    assert rows["llama-cpp"]["identical"] and rows["llama-cpp"]["first_difference"] is None
    # one run of three departs at token 1: not identical, and plain's gap there is named
    assert not rows["ngramcache"]["identical"]
    assert rows["ngramcache"]["first_difference"] == {"token": 1, "top2_gap": 0.0213}
    head, body = table_columns(list(rows.values()))
    assert body[0][1] == "11.0 (10-12)" and body[2][-1] == "NO @1"


def test_demo_first_difference_of_unequal_lengths():
    from ngramcache.cli.demo import first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 2]) == 2  # stopped early: departs where it ended
    assert first_difference([1, 2], [1, 2, 9]) == 2
    assert first_difference([1, 2, 3], [4, 2, 3]) == 0


def test_demo_warns_when_runs_are_over_2x_apart():
    from ngramcache.cli.demo import spread_warnings

    rows = [{"method": "plain", "gen_tok_s_range": [10.0, 19.9], "e2e_tok_s_range": [5.0, 9.0]},
            {"method": "ngramcache", "gen_tok_s_range": [10.0, 25.0], "e2e_tok_s_range": [5.0, 30.0]}]
    warnings = spread_warnings(rows)
    assert len(warnings) == 1  # plain is within 2x; ngramcache is not (said once)
    assert warnings[0].startswith("ngramcache's runs range from 10.0 to 25.0 tok/s (generation), more than 2x")


def test_demo_notes_say_why_outputs_are_or_are_not_identical():
    from ngramcache.cli.demo import identity_notes

    rows = [{"method": "plain", "identical": True, "first_difference": None},
            {"method": "llama-cpp", "identical": True, "first_difference": None},
            {"method": "ngramcache", "identical": False, "first_difference": {"token": 37, "top2_gap": 0.031}}]
    exact = {"exact": True, "measured": True, "rows_equal": 48, "rows": 48, "causes": []}
    not_exact = {"exact": False, "measured": True, "rows_equal": 3, "rows": 48,
                 "causes": ["the model was loaded with weight repacking (...)"]}
    notes = identity_notes(rows, exact)
    assert notes[0] == ("llama-cpp-python's own lookup: identical to plain greedy: it verifies drafts in batches, "
                        "and on this build a batch's logits equal one token's, bit for bit")
    assert notes[1] == ("ngramcache: differs from plain greedy from token 37, where plain's top two logits "
                        "were 0.031 apart: although batched and single-token logits are equal here, "
                        "which points to a bug in that loop")
    notes = identity_notes(rows, not_exact)
    assert notes[0] == ("llama-cpp-python's own lookup: identical to plain greedy on this prompt (no near tie met), "
                        "although this model's batched logits differ from its single-token logits here")
    assert identity_notes(rows, None)[0] == "llama-cpp-python's own lookup: identical to plain greedy on this prompt"
    assert notes[1] == ("ngramcache: differs from plain greedy from token 37, where plain's top two logits were "
                        "0.031 apart: this model's batched logits differ from its single-token logits here "
                        "(the model was loaded with weight repacking (...))")


def test_demo_default_prompt_is_shipped():
    from ngramcache import data

    task = data.demo_task()
    assert "def parse_duration(text, default_unit=\"s\", allow_negative=False):" in task.prompt
    assert task.prompt.endswith("The same function with type hints:\n\n```python\n")
    assert "shipped" in task.source
