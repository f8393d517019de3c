"""`ngramcache chat` and `serve` on the command line: turns read from a pipe, the KV cache kept
across turns, figures per turn; bad flags refused before any model loads."""

from __future__ import annotations

import json
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
    r = _run(["chat", "-m", "smollm2", "-n", "48", "--json", "--no-memory"], turns)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["turn"] for row in rows] == [1, 2]  # the blank line is skipped, 'q' ends the chat
    assert all(row["text"] and 0 < row["tokens"] <= 48 for row in rows)
    # the second turn's prompt holds the first exchange, which the KV cache already had
    assert rows[0]["prompt_tokens_cached"] == 0
    assert rows[1]["prompt_tokens_cached"] >= rows[0]["prompt_tokens"] + rows[0]["tokens"] - 2
    assert all(0 <= row["accepted"] <= row["drafted"] for row in rows)

    r = _run(["chat", "-m", "smollm2", "-n", "16", "--drafter", "suffix"], "Say hello.\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "[turn 1: " in r.stderr and "drafter suffix" in r.stderr and "tok/s" in r.stderr


@pytest.mark.parametrize("cmd", ["chat", "serve"])
@pytest.mark.parametrize("flags,message", [
    (["--spec-draft-n-max", "-1"], "--spec-draft-n-max must be >= 0"),
    (["--spec-draft-n-max", "1000"], "must be <= 256"),
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
