"""`ngramcache demo`: plain decoding, llama-cpp-python's prompt lookup and ngramcache side
by side; llama.cpp's -p/-f prompt rules (fake model) and a short real run."""

from __future__ import annotations

import json

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
    assert rows["ngramcache"]["identical"] and rows["llama-cpp"]["identical"]
    assert rows["ngramcache"]["accepted"] > 0
