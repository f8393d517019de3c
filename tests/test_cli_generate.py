"""`ngramcache generate`: llama.cpp's -p/-f prompt rules and llama-lookup's output layout
(fake model); JSON, the dynamic cache and errors with a real model."""

from __future__ import annotations

import json
import os

import pytest

from conftest import PROMPT_CASES, PROMPTS, _prompt_argv, run_cli


@pytest.mark.parametrize("flags, content, want", PROMPT_CASES)
def test_generate_prompt_rules(tmp_path, capsys, fake_llama, flags, content, want):
    seen, model = fake_llama
    rc, out, err = run_cli(capsys, "generate", "-m", model, "--no-draft", *_prompt_argv(tmp_path, flags, content))
    assert rc == 0, err
    assert seen == [want]
    # llama-lookup's layout: the prompt, the text (draft tokens first), then the block on stderr
    assert out == "\n\n" + want.decode() + "<7><8>\n\n"
    assert "n_accept     = 1\naccept       = 100.000%\n" in err and err.startswith("encoded ")


def test_generate_fails_before_the_model_for_a_dynamic_cache_in_a_missing_folder(tmp_path, capsys, fake_llama):
    seen, model = fake_llama
    lcd = tmp_path / "nodir" / "dyn.bin"
    rc, out, err = run_cli(capsys, "generate", "-m", model, "-p", "x", "-lcd", lcd)
    assert rc == 1 and out == "" and seen == []
    assert err == f"ngramcache generate: error: {lcd}: the directory {lcd.parent} does not exist\n"


@pytest.mark.model
def test_cli_generate_json_and_errors(gemma_path, tmp_path, capsys):
    from ngramcache.cli.main import main

    lcd = tmp_path / "dyn.bin"
    rc = main(["generate", "-p", PROMPTS[0], "-n", "12", "--json", "-c", "1024", "-lcd", str(lcd)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_predict"] == 12 and out["n_prompt"] > 50 and isinstance(out["text"], str)
    assert os.path.getsize(lcd) > 0  # the dynamic cache was written, like llama-lookup -lcd
    rc = main(["generate", "-m", str(tmp_path / "missing.gguf"), "-p", "x"])
    assert rc == 1 and "not found" in capsys.readouterr().err
    rc = main(["generate", "-p", "x", "--spec-draft-n-max", "-1"])
    assert rc == 2 and "spec-draft-n-max" in capsys.readouterr().err
    rc = main(["generate", "-p", "", "-n", "2"])
    assert rc == 2 and "empty" in capsys.readouterr().err


@pytest.mark.model
def test_cli_generate_every_drafter_gives_plain_greedy_text(gemma_path, capsys):
    from ngramcache.drafters.catalog import DRAFTERS
    from ngramcache.cli.main import main

    base = ["generate", "-p", PROMPTS[0], "-n", "24", "--json", "-c", "1024"]
    assert main(base + ["--no-draft"]) == 0
    plain = json.loads(capsys.readouterr().out)["text"]
    for name in DRAFTERS:
        assert main(base + ["--drafter", name]) == 0, name
        out = json.loads(capsys.readouterr().out)
        assert out["drafter"] == name
        assert out["text"] == plain, name
    rc = main(base + ["--drafter", "suffix", "-lcs", "x.ngst"])
    assert rc == 2 and "-lcs and -lcd apply" in capsys.readouterr().err
    rc = main(base + ["--drafter", "mod", "--no-copy"])
    assert rc == 2 and "--no-copy" in capsys.readouterr().err
