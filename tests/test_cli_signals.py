"""The file commands tell the truth about their output under Ctrl-C and SIGTERM, and refuse
inputs that are not files.

A signal at each point of ``create`` and ``merge`` (counting, sorting, writing, after the
rename), put there by ``$NGRAMCACHE_PAUSE_AT``: "interrupted" (130) or "terminated" (143)
leaves the previous output byte for byte and no temporary file; a signal after the rename
is a success. A save stopped while it writes (``_core.stop_saves``) never renames. FIFOs,
devices and directories given as inputs are refused at once, by name (each of these hung
or read until memory ran out), in real subprocesses with bounded waits."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ngramcache import StaticTable, _core
from ngramcache.files import atomic_open, write_tokens_file

OLD = b"the previous output, which an interrupted command must leave as it was\n"


def _tokens(path, n=200_000, seed=0):
    rng = np.random.default_rng(seed)
    write_tokens_file(path, rng.integers(0, 500, n, dtype=np.int32))
    return path


def _start(argv, pause: str | None) -> subprocess.Popen:
    env = {**os.environ, "NGRAMCACHE_PAUSE_AT": pause or ""}
    # Ctrl-C's default action, as in a terminal (a suite started in the background inherits it ignored)
    return subprocess.Popen([sys.executable, "-m", "ngramcache", *map(str, argv), "-q"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _signal_at(proc: subprocess.Popen, point: str, sig: int) -> tuple[int, str]:
    """Wait until ``proc`` says it is paused at ``point``, send ``sig``: (status, stderr)."""
    deadline = time.monotonic() + 120
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        if line.strip() == f"ngramcache: paused at {point}":
            proc.send_signal(sig)
            break
    else:
        proc.kill()
    try:
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"paused at {point}" in seen, seen + rest
    return proc.returncode, rest


def _leftovers(folder, keep) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


@pytest.mark.parametrize("ext", ["ngst", "bin"])
@pytest.mark.parametrize("point,sig,status", [
    ("counting", signal.SIGINT, 130), ("counting", signal.SIGTERM, 143),
    ("writing", signal.SIGINT, 130), ("writing", signal.SIGTERM, 143),
    ("renamed", signal.SIGINT, 0), ("renamed", signal.SIGTERM, 0),
])
def test_create_tells_the_truth_about_its_output(tmp_path, ext, point, sig, status):
    tokens = _tokens(tmp_path / "corpus.i32")
    out = tmp_path / f"out.{ext}"
    out.write_bytes(OLD)
    rc, stderr = _signal_at(_start(["create", "--tokens", tokens, "-lcs", out], point), point, sig)
    assert rc == status, stderr
    assert _leftovers(tmp_path, {"corpus.i32", out.name}) == []
    if status:
        assert stderr == f"ngramcache create: {'terminated' if sig == signal.SIGTERM else 'interrupted'}\n"
        assert out.read_bytes() == OLD
    else:  # the signal came after the rename: the new file is there, and the command says so
        assert "Traceback" not in stderr
        fresh = tmp_path / f"fresh.{ext}"
        r = subprocess.run([sys.executable, "-m", "ngramcache", "create", "--tokens", tokens, "-lcs", fresh, "-q"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and out.read_bytes() == fresh.read_bytes() != OLD


@pytest.mark.parametrize("point,sig,status", [
    ("sorting", signal.SIGINT, 130), ("sorting", signal.SIGTERM, 143),
    ("writing", signal.SIGINT, 130), ("renamed", signal.SIGTERM, 0),
])
def test_merge_tells_the_truth_about_its_output(tmp_path, point, sig, status):
    parts = []
    for i in range(3):
        t = StaticTable.build(np.random.default_rng(i).integers(0, 300, 50_000, dtype=np.int32), ngram_size=2)
        t.save(tmp_path / f"part{i}.ngst")
        parts.append(tmp_path / f"part{i}.ngst")
    out = tmp_path / "all.bin"
    out.write_bytes(OLD)
    rc, stderr = _signal_at(_start(["merge", *parts, out], point), point, sig)
    assert rc == status, stderr
    assert _leftovers(tmp_path, {p.name for p in parts} | {out.name}) == []  # no temporary file, no spool
    if status:
        assert out.read_bytes() == OLD and stderr.endswith("ed\n") and "Traceback" not in stderr
    else:
        assert out.read_bytes() != OLD and out.stat().st_size > 1000


def test_a_stopped_save_never_renames(tmp_path):
    out = tmp_path / "out.bin"
    out.write_bytes(OLD)
    try:
        with pytest.raises(OSError) as e:
            with atomic_open(out) as f:
                f.write(b"x" * 1_000_000)
                _core.stop_saves()
        assert e.value.errno == errno.ECANCELED
        with pytest.raises(OSError) as e:  # a save that starts after the stop does not start
            StaticTable.build(np.arange(1000, dtype=np.int32) % 50, ngram_size=2).save(out)
        assert e.value.errno == errno.ECANCELED
    finally:
        _core.resume_saves()
    assert out.read_bytes() == OLD and sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
    StaticTable.build(np.arange(1000, dtype=np.int32) % 50, ngram_size=2).save(out)  # saves run again
    assert out.read_bytes() != OLD


def test_a_stop_during_a_long_write_leaves_the_old_file(tmp_path):
    """A C++ save of about a hundred megabytes, stopped from another thread while it writes:
    it fails, the old file is intact, no temporary file remains. (A stop that lands after
    the rename lets the save succeed: then the new file is whole.)"""
    out = tmp_path / "big.bin"
    out.write_bytes(OLD)
    data = np.random.default_rng(1).integers(0, 1 << 30, 6_000_000, dtype=np.int32)
    table = StaticTable.build(data, ngram_size=2)
    outcome = {}

    def save():
        try:
            table.to_llama(str(out))
            outcome["saved"] = True
        except OSError as e:
            outcome["error"] = e

    t = threading.Thread(target=save)
    t.start()
    deadline = time.monotonic() + 60
    while t.is_alive() and time.monotonic() < deadline and not _writing(tmp_path):
        time.sleep(0.001)
    _core.stop_saves()
    t.join(120)
    _core.resume_saves()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["big.bin"], names
    if "error" in outcome:
        assert outcome["error"].errno == errno.ECANCELED and out.read_bytes() == OLD
    else:
        assert out.stat().st_size > len(OLD)


def _writing(folder) -> bool:
    """Whether this process has a file open in ``folder`` that has no name there yet (a save's
    anonymous temporary file) or a temporary name."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)) and ("(deleted)" in target or target.endswith(".ngctmp")):
            return True
    return False


# --- inputs that are not files ------------------------------------------------------------


def _run(*argv, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ngramcache", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.ngst"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("argv", [
    ["info", "{x}"], ["info", "--verify", "{x}"], ["convert", "{x}", "{out}.bin"], ["merge", "{x}", "{out}.ngst"],
    ["create", "--tokens", "{x}", "-lcs", "{out}.ngst"], ["stats", "--tokens", "{tokens}", "-lcs", "{x}"],
    ["stats", "--tokens", "{tokens}", "-lcd", "{x}"],
])
def test_a_fifo_input_is_refused_at_once(tmp_path, fifo, argv):
    tokens = _tokens(tmp_path / "t.i32", 5000)
    argv = [a.format(x=fifo, out=tmp_path / "out", tokens=tokens) for a in argv]
    r = _run(*argv)
    assert r.returncode in (1, 2) and "Traceback" not in r.stderr, r.stderr
    assert f"{fifo}: is a pipe (FIFO), not a regular" in r.stderr, r.stderr


@pytest.mark.parametrize("argv", [["info", "/dev/zero"], ["create", "--tokens", "/dev/zero", "-lcs", "{out}"],
                                  ["merge", "/dev/zero", "{out}"], ["convert", "/dev/zero", "{out}"]])
def test_a_device_input_is_refused_at_once(tmp_path, argv):
    argv = [a.format(out=tmp_path / "out.ngst") for a in argv]
    r = _run(*argv)
    assert r.returncode in (1, 2) and "/dev/zero: is a character device, not a regular" in r.stderr, r.stderr


def test_create_tokens_from_a_process_substitution_names_the_problem(tmp_path):
    out = tmp_path / "out.ngst"
    script = f"{sys.executable} -m ngramcache create --tokens <(cat {_tokens(tmp_path / 't.i32', 5000)}) -lcs {out}"
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "is a pipe (FIFO), not a regular token file" in r.stderr, r.stderr
    assert "obtaining file position" not in r.stderr and not out.exists()


def test_a_directory_input_is_named(tmp_path):
    (tmp_path / "adir").mkdir()
    r = _run("create", "--tokens", tmp_path / "adir", "-lcs", tmp_path / "out.ngst")
    assert r.returncode == 1 and f"{tmp_path / 'adir'}: is a directory, not a token file" in r.stderr, r.stderr
