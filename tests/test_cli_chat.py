"""`ngramcache chat` and `serve` on the command line: turns read from a pipe, the KV cache kept
across turns, figures per turn; bad flags refused before any model loads."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest


def _run(args, stdin: str = "", timeout: float = 300):
    return subprocess.run([sys.executable, "-m", "ngramcache", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.model
def test_chat_reads_turns_from_a_pipe_and_keeps_the_kv_cache():
    pytest.importorskip("llama_cpp")
    turns = "Write a Python function that adds two numbers.\n\nNow add a docstring. Give the full code.\nq\nnever read\n"
    r = _run(["chat", "-m", "smollm2", "-n", "48", "--json", "--no-memory", "--fixed-draft"], turns)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["turn"] for row in rows] == [1, 2]  # the blank line is skipped, 'q' ends the chat
    assert all(row["text"] and 0 < row["tokens"] <= 48 for row in rows)
    # the second turn's prompt holds the first exchange, which the KV cache already had
    assert rows[0]["prompt_tokens_cached"] == 0
    assert rows[1]["prompt_tokens_cached"] >= rows[0]["prompt_tokens"] + rows[0]["tokens"] - 2
    assert all(0 <= row["accepted"] <= row["drafted"] for row in rows)

    r = _run(["chat", "-m", "smollm2", "-n", "16", "--drafter", "suffix", "--fixed-draft"], "Say hello.\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "[turn 1: " in r.stderr and "drafter suffix" in r.stderr and "tok/s" in r.stderr


@pytest.mark.parametrize("cmd", ["chat", "serve"])
@pytest.mark.parametrize("flags,message", [
    (["--spec-draft-n-max", "-1"], "--spec-draft-n-max must be 0 to 256, got -1"),
    (["--spec-draft-n-max", "1000"], "--spec-draft-n-max must be 0 to 256, got 1000"),
    (["-c", "8"], "-c must be >= 64"),
    (["--memory", "x.bin", "--no-memory"], "contradict"),
    (["--memory-save-interval", "0"], "--memory-save-interval must be > 0"),
    (["--drafter", "simple", "--spec-ngram-mod-n-match", "4"], "applies to --drafter mod"),
    (["--temp", "-1"], "--temp must be >= 0"),
])
def test_bad_flags_are_usage_errors(cmd, flags, message):
    r = _run([cmd, *flags], timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("cmd", ["chat", "serve"])
def test_a_memory_file_in_a_missing_folder_fails_before_the_model_loads(cmd, tmp_path):
    memory = tmp_path / "nodir" / "memory.bin"
    r = _run([cmd, "-m", str(tmp_path / "no-model.gguf"), "--memory", str(memory)], timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr == f"ngramcache {cmd}: error: {memory}: the directory {memory.parent} does not exist\n"


def test_serve_refuses_a_bad_port():
    r = _run(["serve", "--port", "70000"], timeout=60)
    assert r.returncode == 2 and "--port" in r.stderr


def test_a_damaged_memory_file_is_named_once(monkeypatch, capsys, tmp_path):
    """A state file's refusal already names the file, its kind and the problem: the command
    line prints it as it is, with no second "damaged or not a cache file" before it."""
    from ngramcache.cli import chat
    from ngramcache.cli.main import main
    from ngramcache.serving import Memory

    path = tmp_path / "memory.bin"
    path.write_bytes(b"NGSRVMEM\x01\x00")  # the magic, then a header cut short
    # the engine's own load of --memory, without a model to load first
    monkeypatch.setattr(chat, "build_engine", lambda args: Memory.load(path, 1000, bytes(32)))
    assert main(["chat"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ngramcache chat: error: {path}: damaged or not a server memory file ("), err
    assert "cache file" not in err and err.count("\n") == 1, err


# -- the terminal chat, with a stand-in engine (no model) -----------------------------------

class FakeTemplate:
    def render(self, messages):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)


class FakeEngine:
    """Answers every turn with a fixed text, part of it 'from drafts'; records the prompts."""

    model_name, drafter, n_draft, n_ctx, temperature = "fake", "copy", 16, 4096, 0.0

    def __init__(self, template=True):
        self.chat_template = FakeTemplate() if template else None
        self.prompts: list[str] = []
        self.closed = False

    def tokenize(self, text):
        import numpy as np
        return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int32)

    def run(self, job):
        import numpy as np
        from ngramcache.serving.engine import JobResult

        self.prompts.append(bytes(job.prompt.astype(np.uint8)).decode())
        if job.on_text is not None:
            job.on_text("plain ", False)
            job.on_text("drafted", True)
        return JobResult(text="plain drafted", tokens=np.arange(5, dtype=np.int32), n_prompt=int(job.prompt.size),
                         n_cached=0, finish_reason="stop", drafter="copy", drafted=4, accepted=3, t_prompt=0.1,
                         t_draft=0.0, t_verify=0.1, t_total=0.6, t_queue=0.0)

    def close(self):
        self.closed = True


class FakeTty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def fake_chat(monkeypatch):
    """Run `chat` in this process on ``stdin_bytes``: (exit status, stdout, stderr, engine)."""
    from ngramcache.cli import chat
    from ngramcache.cli.main import main

    def go(stdin_bytes: bytes, *flags, engine=None, stdout=None):
        engine = engine or FakeEngine()
        monkeypatch.setattr(chat, "build_engine", lambda args: engine)
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin_bytes), encoding="utf-8"))
        out, err = stdout or io.StringIO(), io.StringIO()
        monkeypatch.setattr(sys, "stdout", out)
        monkeypatch.setattr(sys, "stderr", err)
        rc = main(["chat", *flags])
        return rc, out.getvalue(), err.getvalue(), engine
    return go


def test_a_line_that_is_not_utf8_is_named_and_the_chat_goes_on(fake_chat, monkeypatch):
    rc, out, err, engine = fake_chat(b"Say hi\n\xff\xfe bad\nSay bye\n")
    assert rc == 0 and engine.closed
    assert "ngramcache chat: line 2 is not valid UTF-8 (byte 0xFF at offset 0): skipped" in err.splitlines()
    assert [p.rsplit("<user>", 1)[1] for p in engine.prompts] == ["Say hi", "Say bye"]
    assert out == "plain drafted\n" * 2  # a pipe: no colour
    assert "[turn 2: 5 tokens, 10.0 tok/s, drafted 4, accepted 3 (75%), prompt " in err


def test_a_bad_byte_inside_a_line_is_located():
    from ngramcache.cli.chat import read_lines

    said = []
    lines = list(read_lines(io.TextIOWrapper(io.BytesIO("ok\nnaïve \xe9t\xe9\n".encode("utf-8") + b"caf\xe9\n"),
                                             encoding="utf-8"), said.append))
    assert lines == [(1, "ok"), (2, "naïve été")]
    assert said == ["line 3 is not valid UTF-8 (byte 0xE9 at offset 3): skipped"]
    # a text stream that already turned bad bytes into surrogates (the C locale's stdin)
    said.clear()
    lines = list(read_lines(io.StringIO(b"ab\xffc\nfine\n".decode("utf-8", "surrogateescape")), said.append))
    assert lines == [(2, "fine")] and said == ["line 1 is not valid UTF-8 (byte 0xFF at offset 2): skipped"]


def test_commands_are_answered_here_and_never_sent(fake_chat):
    rc, out, err, engine = fake_chat(b"/help\n/frobnicate now\n//etc/passwd is a file\nhello\n/reset\nagain\n"
                                     b"/quit\nnever sent\n", "--system", "Be brief.")
    assert rc == 0
    sent = engine.prompts
    assert len(sent) == 3
    assert sent[0].endswith("<user>/etc/passwd is a file")  # '//' sends the line without its first '/'
    assert sent[1].endswith("<user>hello") and "/etc/passwd" in sent[1]
    assert sent[2] == "<system>Be brief.<user>again"  # /reset forgot the conversation, not the system message
    assert "unknown command /frobnicate: /help lists the commands" in err
    assert "/reset  forget the conversation" in err and "/quit" in err
    assert "never sent" not in "".join(engine.prompts)


def test_banner_and_figures_on_stderr_and_q_leaves_them_out(fake_chat):
    rc, out, err, engine = fake_chat(b"hello\n")
    lines = err.splitlines()
    assert lines[0] == "ngramcache chat: model fake, drafter copy, up to 16 tokens a step"
    assert lines[1].startswith("commands: /help, /reset, /quit")
    assert lines[2].startswith("[turn 1: 5 tokens, 10.0 tok/s, drafted 4, accepted 3 (75%), prompt ")
    rc, out, err, engine = fake_chat(b"hello\n/nope\n", "-q")
    assert out == "plain drafted\n" and err.splitlines() == [
        "unknown command /nope: /help lists the commands (a line that starts with // is sent to the model "
        "without its first /)"]


def test_drafted_text_is_blue_on_a_terminal_unless_no_color(fake_chat, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    rc, out, err, engine = fake_chat(b"hello\n", stdout=FakeTty())
    assert out == "plain \x1b[34mdrafted\x1b[0m\n" and "drafted text in blue" in err
    monkeypatch.setenv("NO_COLOR", "1")
    rc, out, err, engine = fake_chat(b"hello\n", stdout=FakeTty())
    assert out == "plain drafted\n" and "blue" not in err
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    rc, out, err, engine = fake_chat(b"hello\n", stdout=FakeTty())
    assert out == "plain drafted\n"


def test_json_turns(fake_chat):
    rc, out, err, engine = fake_chat(b"one\ntwo\n", "--json", "-q")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["turn"], r["text"], r["tokens"], r["drafted"], r["accepted"]) for r in rows] == [
        (1, "plain drafted", 5, 4, 3), (2, "plain drafted", 5, 4, 3)]
    assert err == ""


def test_chat_help_speaks_of_turns_not_requests(capsys):
    """chat shares serve's engine flags, worded for a chat: its turns cannot choose their own
    temperature or drafter, as a server's requests can."""
    from ngramcache.cli.main import main

    with pytest.raises(SystemExit):
        main(["chat", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "request" not in text
    for said in ("--temp T temperature; 0 = greedy", "--drafter NAME what drafts: copy,",
                 "--no-draft plain decoding, one token per step", "memory across turns:",
                 "--json print each turn (its text and figures) as one JSON object a line on stdout, instead of "
                 "the streamed text"):
        assert said in text, said
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--temp T temperature when a request gives none" in text and "memory across requests:" in text


def test_a_model_without_a_chat_template_is_one_line_and_a_hint(fake_chat):
    rc, out, err, engine = fake_chat(b"hello\n", engine=FakeEngine(template=False))
    assert rc == 2 and engine.closed and out == ""
    assert err.splitlines() == ["ngramcache chat: error: this model has no chat template in its GGUF; give one "
                                "with --chat-template-file", "try 'ngramcache chat --help'"]


# -- the terminal chat with a real model: through a pipe and a pseudo-terminal --------------

COPY_PROMPT = ("Repeat this line exactly, twice: the quick brown fox jumps over the lazy dog, "
               "the quick brown fox jumps over the lazy dog.")


@pytest.mark.model
def test_chat_goes_on_after_a_line_of_bad_utf8_from_a_pipe():
    pytest.importorskip("llama_cpp")
    r = subprocess.run([sys.executable, "-m", "ngramcache", "chat", "-m", "smollm2", "-n", "12", "--no-memory", "--fixed-draft"],
                       input=b"Say hi\n\377\376 bad\nSay bye\n", capture_output=True, timeout=300)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "ngramcache chat: line 2 is not valid UTF-8 (byte 0xFF at offset 0): skipped" in err
    assert "[turn 1: " in err and "[turn 2: " in err and "[turn 3: " not in err
    assert b"\x1b[" not in r.stdout  # a pipe gets no colour


def _pty_chat(lines: list[str], env_extra: dict, timeout: float = 300) -> str:
    """Run `chat` with stdin, stdout and stderr on a pseudo-terminal; type each (line, marker)
    of ``lines`` once the previous marker was shown, then Ctrl-D if the chat still runs;
    return everything shown."""
    import pty
    import select
    import time

    main_fd, sub_fd = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(TERM="xterm", **env_extra)
    proc = subprocess.Popen([sys.executable, "-m", "ngramcache", "chat", "-m", "smollm2", "-n", "40", "--no-memory", "--fixed-draft"],
                            stdin=sub_fd, stdout=sub_fd, stderr=sub_fd, env=env, close_fds=True)
    os.close(sub_fd)
    shown = b""

    def read_until(marker: bytes, deadline: float) -> None:
        nonlocal shown
        while marker not in shown:
            assert time.monotonic() < deadline, (marker, shown.decode(errors="replace"))
            ready, _, _ = select.select([main_fd], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(main_fd, 4096)
                except OSError:  # the chat ended: the terminal is gone
                    chunk = b""
                if not chunk:
                    assert marker in shown, (marker, shown.decode(errors="replace"))
                shown += chunk

    try:
        deadline = time.monotonic() + timeout
        read_until(b"> ", deadline)
        for line, marker in lines:
            start = len(shown)
            os.write(main_fd, line.encode() + b"\n")
            read_until(marker.encode(), deadline)
            assert marker.encode() in shown[start:]
        if proc.poll() is None:
            os.write(main_fd, b"\x04")  # Ctrl-D at the prompt: end of input
        proc.wait(timeout=60)
        try:
            while True:
                chunk = os.read(main_fd, 4096)
                if not chunk:
                    break
                shown += chunk
        except OSError:
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main_fd)
    assert proc.returncode == 0, shown.decode(errors="replace")
    return shown.decode(errors="replace")


@pytest.mark.model
def test_chat_in_a_terminal_banner_colour_commands_and_figures():
    pytest.importorskip("llama_cpp")
    shown = _pty_chat([("/help", "start a new one"), ("/frobnicate", "unknown command /frobnicate"),
                       (COPY_PROMPT, "[turn 1: "), ("/reset", "forgotten"), ("/quit", "")], {})
    assert "ngramcache chat: model smollm2, drafter copy" in shown and "drafted text in blue" in shown
    assert "commands: /help, /reset, /quit" in shown
    assert shown.count("[turn ") == 1  # the commands were answered here: one turn reached the model
    assert "\x1b[34m" in shown  # the accepted drafts of the copied line
    figures = shown.split("[turn 1: ")[1].split("]")[0]
    assert " tokens, " in figures and " tok/s, " in figures and "drafted " in figures and "accepted " in figures


@pytest.mark.model
def test_chat_in_a_terminal_without_colour_when_no_color_is_set():
    pytest.importorskip("llama_cpp")
    shown = _pty_chat([(COPY_PROMPT, "[turn 1: ")], {"NO_COLOR": "1"})
    assert "[turn 1: " in shown and "drafted " in shown.split("[turn 1: ")[1]
    assert "\x1b[34m" not in shown and "blue" not in shown


def test_a_negative_seed_is_refused(capsys):
    from ngramcache.cli.main import main

    assert main(["chat", "-m", "smollm2", "--seed", "-1"]) == 2
    assert "--seed must be >= 0" in capsys.readouterr().err
