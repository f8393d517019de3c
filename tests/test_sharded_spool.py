"""Spool folders (ngramcache.corpus.spool): what a killed writer leaves beside its output is
removed by the next writer in that folder, and a live writer's spool never is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ngramcache import NgramCache
from ngramcache.corpus import sharded, spool
from ngramcache.corpus.spool import remove_stale_spools, spool_folder

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX processes and locks")

# A writer in another process: it makes its spool, says where, and waits to be killed.
WRITER = textwrap.dedent("""
    import sys, time
    from ngramcache.corpus.spool import spool_folder
    with spool_folder(sys.argv[1]) as path:
        (path / "shard-000000.run").write_bytes(b"x" * 4096)
        print(path, flush=True)
        time.sleep(600)
""")


def _start_writer(out):
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    assert line, "the writer did not start"
    return p, line


def _kill(p) -> None:
    p.send_signal(signal.SIGKILL)  # what the OOM killer sends: no exit handler runs
    p.wait()
    p.stdout.close()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _spools(folder):
    return sorted(p.name for p in folder.iterdir() if ".runs-" in p.name)


def test_a_killed_writers_spool_is_removed_by_the_next_writer(tmp_path):
    out = tmp_path / "out.ngst"
    writer, path = _start_writer(out)
    try:
        assert os.path.isdir(path) and os.path.basename(path).startswith(".out.ngst.runs-")
        assert remove_stale_spools(tmp_path) == []  # alive: kept
        assert os.path.isdir(path)
    finally:
        _kill(writer)
    assert os.path.isfile(os.path.join(path, "shard-000000.run"))  # nothing cleaned up at the kill
    with spool_folder(out) as mine:
        assert not os.path.exists(path)
        assert _spools(tmp_path) == [mine.name]
    assert _spools(tmp_path) == []


def test_a_live_writers_spool_survives_another_writer(tmp_path):
    writer, path = _start_writer(tmp_path / "a.ngst")
    try:
        with spool_folder(tmp_path / "b.ngst") as mine:
            assert os.path.isdir(path) and mine.is_dir()
        assert _spools(tmp_path) == [os.path.basename(path)]
    finally:
        _kill(writer)


def test_an_unlocked_spool_is_stale_even_when_its_pid_was_reused(tmp_path):
    # The pid (this process) lives, but no one holds the lock: the writer is gone.
    name = f".o.ngst.runs-{spool._host()}-{os.getpid()}-0123abcd"
    (tmp_path / name).mkdir()
    (tmp_path / name / spool.LOCK_NAME).write_bytes(b"")
    assert remove_stale_spools(tmp_path) == [tmp_path / name]


def test_without_a_lock_the_pid_decides(tmp_path):
    host = spool._host()
    dead = tmp_path / f".o.ngst.runs-{host}-{_dead_pid()}-0123abcd"
    # A live writer between making its folder and taking its lock (the lock still under
    # its staging name).
    starting = tmp_path / f".o.ngst.runs-{host}-{os.getpid()}-4567cdef"
    for d in (dead, starting):
        d.mkdir()
    (starting / f"{spool.LOCK_NAME}.{os.getpid()}").write_bytes(b"")
    assert remove_stale_spools(tmp_path) == [dead]
    assert starting.is_dir()


def test_other_hosts_and_other_folders_are_left_alone(tmp_path):
    kept = [f".o.ngst.runs-another-host-{_dead_pid()}-0123abcd",  # another host: its pids mean nothing here
            ".o.ngst.runs-abc123xy",  # no owner in the name
            f".notes.runs-{spool._host()}-1-0123abcd.txt"]  # not a spool
    for name in kept[:2]:
        (tmp_path / name).mkdir()
    (tmp_path / kept[2]).write_text("mine")
    assert remove_stale_spools(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_a_hostname_with_odd_characters_still_names_a_spool(tmp_path, monkeypatch):
    monkeypatch.setattr(spool.socket, "gethostname", lambda: "build box/7")
    with spool_folder(tmp_path / "o.bin") as path:
        assert path.name.startswith(".o.bin.runs-build_box_7-")
        assert spool._SPOOL_NAME.match(path.name)["pid"] == str(os.getpid())


def test_merges_clean_up_after_a_killed_merge(tmp_path):
    """merge_cache_files and merge_runs (lookup.bin records) go through spool folders too."""
    writer, path = _start_writer(tmp_path / "merged.bin")
    _kill(writer)
    inputs = []
    for i in range(2):
        c = NgramCache()
        c.update(np.array([1, 2, 3, 1, 2, 4 + i], dtype=np.int32), 2, 2)
        inputs.append(tmp_path / f"in{i}.bin")
        c.save(str(inputs[-1]))
    sharded.merge_cache_files(inputs, tmp_path / "merged.bin", "llama")
    assert not os.path.exists(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in0.bin", "in1.bin", "merged.bin"]
