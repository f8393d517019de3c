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


def test_generate_quiet_prints_the_text_and_nothing_on_stderr(capsys, fake_llama):
    seen, model = fake_llama
    rc, out, err = run_cli(capsys, "generate", "-m", model, "--no-draft", "-p", "hi", "-q", "--no-prompt")
    assert rc == 0 and seen == [b"hi"]
    assert out == "<7><8>\n\n" and err == ""
    rc, out, err = run_cli(capsys, "generate", "-m", model, "--no-draft", "-p", "hi", "-q", "--json")
    assert rc == 0 and json.loads(out)["n_decoded"] == 2 and err == ""  # --json keeps its figures


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


# --- --chat and -sys -------------------------------------------------------------------

_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
             "{% if add_generation_prompt %}<assistant>{% endif %}")


def _fake_chat_model(monkeypatch, template: str | None):
    """make_llama gives a model whose GGUF holds ``template`` (None: no chat template) and whose
    tokenizer turns each byte into one id, so that the prompt generate receives reads back."""
    from types import SimpleNamespace
    import ngramcache.integrations.llama as nl

    def tokenize(text: bytes, add_bos: bool = True, special: bool = False):
        return ([1] if add_bos else []) + list(text)

    llm = SimpleNamespace(metadata={"tokenizer.chat_template": template} if template else {},
                          _model=SimpleNamespace(token_get_text=lambda tok: {1: "<s>", 2: "</s>"}[tok]),
                          token_bos=lambda: 1, token_eos=lambda: 2, tokenize=tokenize)
    monkeypatch.setattr(nl, "make_llama", lambda *a, **k: llm)


def _read_back(tokens) -> str:
    assert int(tokens[0]) == 1  # the BOS, added once: this template writes none
    return bytes(int(t) for t in tokens[1:]).decode()


def test_generate_chat_sends_the_rendered_messages(tmp_path, capsys, monkeypatch, fake_llama):
    seen, model = fake_llama
    _fake_chat_model(monkeypatch, _TEMPLATE)
    rc, out, err = run_cli(capsys, "generate", "-m", model, "--no-draft", "--chat", "-p", "hi\\tthere")
    assert rc == 0, err
    assert _read_back(seen[-1]) == "<user>hi\tthere</user><assistant>"
    assert out == "\n\n<user>hi\tthere</user><assistant><7><8>\n\n"  # the rendered prompt is echoed

    rc, out, err = run_cli(capsys, "generate", "-m", model, "--no-draft", "-sys", "Be brief.\\nVery.", "-p", "hi")
    assert rc == 0, err  # -sys alone implies --chat; its escapes are processed like -p's
    assert _read_back(seen[-1]) == "<system>Be brief.\nVery.</system><user>hi</user><assistant>"

    rc, out, err = run_cli(capsys, "generate", "-m", model, "--no-draft", "--no-escape", "--system", "a\\n",
                           "-p", "b\\n", "--json")
    assert rc == 0, err
    assert _read_back(seen[-1]) == "<system>a\\n</system><user>b\\n</user><assistant>"
    assert json.loads(out)["chat"] is True


def test_generate_chat_template_file_replaces_the_models(tmp_path, capsys, monkeypatch, fake_llama):
    seen, model = fake_llama
    _fake_chat_model(monkeypatch, None)
    path = tmp_path / "t.jinja"
    path.write_text("{{ bos_token }}[{{ messages[-1]['content'] }}]", encoding="utf-8")
    rc, out, err = run_cli(capsys, "generate", "-m", model, "--no-draft", "--chat-template-file", path,
                           "-p", "q", "--json")
    assert rc == 0, err
    # the template writes the BOS's text itself: no BOS id is added in front of it
    assert [int(t) for t in seen[-1]] == list(b"<s>[q]")
    rc, out, err = run_cli(capsys, "generate", "-m", model, "--chat-template-file", tmp_path / "none.jinja",
                           "-p", "q")
    assert rc == 1 and "none.jinja" in err and len(seen) == 1


def test_generate_chat_errors(tmp_path, capsys, monkeypatch, fake_llama):
    seen, model = fake_llama
    _fake_chat_model(monkeypatch, None)
    rc, out, err = run_cli(capsys, "generate", "-m", model, "--chat", "-p", "hi")
    assert rc == 2 and out == "" and seen == []
    assert err == ("ngramcache generate: error: this model has no chat template in its GGUF; give one with "
                   "--chat-template-file\ntry 'ngramcache generate --help'\n")
    rc, out, err = run_cli(capsys, "generate", "-m", model, "--no-draft", "-p", "hi")
    assert rc == 0 and len(seen) == 1  # without --chat the same model takes the raw prompt
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9")
    rc, out, err = run_cli(capsys, "generate", "-m", model, "--chat", "-f", bad)
    assert rc == 2 and len(seen) == 1
    assert err.startswith("ngramcache generate: error: the prompt is not UTF-8 text (byte 3); --chat needs text\n")
    _fake_chat_model(monkeypatch, "{{ raise_exception('only user messages') }}")
    rc, out, err = run_cli(capsys, "generate", "-m", model, "-sys", "x", "-p", "hi")
    assert rc == 2 and len(seen) == 1 and "only user messages" in err


_CHAT = "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog."


@pytest.mark.model
def test_cli_generate_chat_answers_as_serve_does(capsys):
    import ngramcache.integrations.llama as nl
    from ngramcache.cli.main import main
    from ngramcache.models import model_path
    from ngramcache.serving.engine import Engine, Job

    pytest.importorskip("llama_cpp")
    try:
        path = model_path("smollm2")
    except FileNotFoundError as e:
        pytest.skip(str(e))
    base = ["generate", "-m", "smollm2", "-p", _CHAT, "-n", "96", "-c", "1024"]
    assert main(base + ["--chat", "--no-draft", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    # a real answer, ended by the template's end of turn rather than by -n
    assert plain["text"].strip() and plain["stop_reason"] == "eos" and plain["chat"] is True
    assert main(base + ["--no-draft", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] != plain["text"]  # the raw prompt reads otherwise

    engine = Engine(nl.make_llama(path, n_ctx=1024), drafter=None, adaptive=False)
    try:
        messages = [{"role": "user", "content": _CHAT}]
        served = engine.run(Job(prompt=engine.tokenize(engine.chat_template.render(messages)), max_tokens=96))
    finally:
        engine.close()
    assert served.text == plain["text"] and served.n_prompt == plain["n_prompt"]

    assert main(base + ["-sys", "Answer in French.", "--no-draft"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("\n\n<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>user\n" + _CHAT)
    assert "You are a helpful AI assistant" not in out  # the template's own system message gives way


@pytest.mark.model
def test_cli_generate_chat_drafts_change_nothing(capsys):
    from ngramcache.drafters.catalog import DRAFTERS
    from ngramcache.cli.main import main

    pytest.importorskip("llama_cpp")
    base = ["generate", "-m", "smollm2", "--chat", "-p", _CHAT, "-n", "48", "-c", "1024", "--json"]
    try:
        assert main(base + ["--no-draft"]) == 0
    except FileNotFoundError as e:
        pytest.skip(str(e))
    plain = json.loads(capsys.readouterr().out)
    accepted = 0
    # --fixed-draft: every proposal verified whole, and no run waits on measuring verify costs
    for flags in [["--drafter", name, "--fixed-draft"] for name in DRAFTERS]:
        assert main(base + flags) == 0, flags
        out = json.loads(capsys.readouterr().out)
        assert (out["text"], out["n_decoded"], out["stop_reason"]) == (plain["text"], plain["n_decoded"],
                                                                       plain["stop_reason"]), flags
        accepted += out["n_accept"]
    assert accepted > 0  # the drafts were verified, not all refused
