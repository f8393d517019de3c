"""``create --workers`` / ``--scheduler`` on a real Dask LocalCluster of worker processes:
the same bytes as the single-process create, also when a worker is killed mid-run."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from conftest import run_cli, run_json
from support import smollm2_path, stdlib_corpus

pytest.importorskip("distributed", reason="the 'distributed' extra (Dask) is not installed")
pytestmark = pytest.mark.model

import ngramcache.corpus.sharded as sharded  # noqa: E402
from ngramcache.files import expand_inputs  # noqa: E402

PIECE = "8192"     # small pieces, so long files get split between shards
SHARD = "20000"    # small shards: a dozen or more for the corpus below


@pytest.fixture(scope="module")
def client():
    c = sharded.local_client(2)
    yield c
    sharded.close_client(c)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return stdlib_corpus(tmp_path_factory.mktemp("dask"), limit=150_000)


@pytest.fixture(scope="module")
def single(corpus, tmp_path_factory):
    """The single-process create's files, both formats."""
    folder = tmp_path_factory.mktemp("single")
    out = {}
    for ext in ("ngst", "bin"):
        out[ext] = folder / f"ref.{ext}"
        rc = run_cli_plain("create", "-m", smollm2_path(), "-f", corpus, "--piece-size", PIECE, "-j", "1",
                           "-lcs", out[ext], "-q")
        assert rc == 0
    return out


def run_cli_plain(*argv) -> int:
    from ngramcache.cli.main import main
    return main([str(a) for a in argv])


def test_workers_flag_equals_single_process(corpus, single, tmp_path, capsys):
    out = tmp_path / "dask.ngst"
    s = run_json(capsys, "create", "--workers", "2", "-m", smollm2_path(), "-f", corpus,
                 "--piece-size", PIECE, "--shard-size", SHARD, "-lcs", out)
    assert s["engine"] == "dask" and s["scheduler"] == "local:2" and s["shards"] >= 8
    assert out.read_bytes() == single["ngst"].read_bytes()
    assert set(s["stage_seconds"]) >= {"count shards", "merge"}


@pytest.mark.parametrize("ext", ["ngst", "bin"])
def test_scheduler_flag_equals_single_process(client, corpus, single, tmp_path, capsys, ext):
    out = tmp_path / f"dask.{ext}"
    s = run_json(capsys, "create", "--scheduler", client.scheduler.address, "-m", smollm2_path(), "-f", corpus,
                 "--piece-size", PIECE, "--shard-size", SHARD, "-lcs", out)
    assert s["scheduler"] == client.scheduler.address
    assert out.read_bytes() == single[ext].read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # spooled runs removed


def test_killed_worker_is_retried_and_the_file_is_the_same(client, corpus, single, tmp_path):
    """SIGKILL of a worker process after the first run arrives: Dask reruns its shards
    on the other worker (and on the one its nanny restarts); the bytes do not change."""
    pids_before = client.run(os.getpid)
    files, _ = expand_inputs([corpus])
    shards = sharded.plan_shards(files, int(SHARD))
    killed = []

    class KillOnFirstRun:
        arrived = 0

        def update(self, n):
            self.arrived += 1
            if not killed:
                # The worker that is busy now: it holds a running shard.
                busy = [addr for addr, tasks in client.processing().items() if tasks]
                victim = busy[0] if busy else next(iter(pids_before))
                os.kill(pids_before[victim], signal.SIGKILL)
                killed.append((victim, self.arrived))

    out = tmp_path / "killed.bin"
    tok_spec = ("gguf", smollm2_path())
    r = sharded.create_sharded(files, out, "llama", client, tokenizer_spec=tok_spec, piece_bytes=int(PIECE),
                               shard_bytes=int(SHARD), progress=KillOnFirstRun())
    assert killed and killed[0][1] < len(shards)  # killed while shards were still to come
    assert r["shards"] == len(shards)
    assert out.read_bytes() == single["bin"].read_bytes()
    client.wait_for_workers(2, timeout=60)
    assert set(client.run(os.getpid).values()) != set(pids_before.values())


def _gemma_path() -> str:
    from ngramcache.models import default_model_path
    try:
        return default_model_path("gemma")
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_tokenize_shard_is_a_slice_of_tokenize_files(corpus, model):
    """Gemma's BOS comes once per file, also for a file split between shards."""
    import numpy as np
    from ngramcache.corpus.tokenizers import load_tokenizer, tokenize_files

    tok = load_tokenizer(model=smollm2_path() if model == "smollm2" else _gemma_path())
    files, _ = expand_inputs([corpus])
    whole = tokenize_files(files, tok, jobs=1, piece_bytes=int(PIECE))
    shards = sharded.plan_shards(files, 15_000)
    assert any(s.parts[0][2] > 1 for s in shards)  # some file is split
    parts = [sharded.tokenize_shard(s, tok, True, int(PIECE)) for s in shards]
    assert np.array_equal(np.concatenate(parts), whole)


def test_worker_error_reaches_the_user(client, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc \\xF4\\x90\\x80\\x80 def\n")
    rc, out, err = run_cli(capsys, "create", "--scheduler", client.scheduler.address, "-m", smollm2_path(),
                           "-f", bad, "-lcs", tmp_path / "o.ngst")
    assert rc == 1 and f"{bad}: byte offset 4:" in err and "U+110000" in err
    assert not (tmp_path / "o.ngst").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _die(*args, **kwargs):
    os._exit(1)


def _count_shard_dies():
    # Runs on a worker: its tasks now unpickle a count_shard that ends the process.
    sharded.count_shard = _die


def test_a_shard_that_kills_every_worker_is_one_error(corpus, tmp_path, capsys):
    import dask

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        c = sharded.local_client(1)
    try:
        c.run(_count_shard_dies)
        files, _ = expand_inputs([corpus])
        with pytest.raises(RuntimeError, match=r"shard \d+ \(.*\) took down every worker that ran it"):
            sharded.create_sharded(files, tmp_path / "o.ngst", "ngst", c, tokenizer_spec=("gguf", smollm2_path()))
    finally:
        sharded.close_client(c)
    assert not list(tmp_path.iterdir())


# -- a run that is killed or interrupted ----------------------------------------------------

def _long_corpus(folder) -> "os.PathLike":
    """Text that takes a worker several seconds: time to kill a run in the middle."""
    import random

    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    path = folder / "long.txt"
    with open(path, "w") as f:
        for _ in range(120_000):
            f.write(" ".join(rng.choice(words) for _ in range(8)) + "\n")
    return path


def _start_create(tmp_path, corpus, out):
    """`create --workers 1` in its own process group, as a terminal runs it."""
    import subprocess
    argv = [sys.executable, "-m", "ngramcache", "create", "--workers", "1", "-m", smollm2_path(), "-f", corpus,
            "--shard-size", "262144", "-lcs", out, "-q"]
    # Ctrl-C's default action, as in a terminal: a test suite started in the background by a
    # shell inherits SIGINT ignored, and so would the command
    return subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_a_spooled_run(proc, folder, timeout=120.0):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for spool in folder.glob(".*.runs-*"):
            if any(spool.glob("shard-*.run")):
                return spool
        time.sleep(0.02)
    raise AssertionError("no run was spooled in time")


def _hidden(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_sigkilled_run_leaves_a_spool_that_the_next_run_removes(tmp_path, capsys):
    corpus = _long_corpus(tmp_path)
    out = tmp_path / "out.ngst"
    proc = _start_create(tmp_path, corpus, out)
    try:
        spool = _wait_for_a_spooled_run(proc, tmp_path)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its workers, as the OOM killer would
        proc.communicate()
    assert spool.is_dir() and _hidden(tmp_path) == [spool.name]
    small = tmp_path / "small.txt"
    small.write_text("a small text, counted quickly\n" * 50)
    s = run_json(capsys, "create", "--workers", "1", "-m", smollm2_path(), "-f", small, "-lcs", out)
    assert s["tokens"] > 0 and out.is_file()
    assert _hidden(tmp_path) == []


def test_ctrl_c_stops_the_run_with_one_line_and_no_worker_tracebacks(tmp_path):
    corpus = _long_corpus(tmp_path)
    out = tmp_path / "out.ngst"
    proc = _start_create(tmp_path, corpus, out)
    try:
        _wait_for_a_spooled_run(proc, tmp_path)
        os.killpg(proc.pid, signal.SIGINT)  # what a Ctrl-C in the terminal sends
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130
    assert stderr == "ngramcache create: interrupted\n"
    assert not out.exists() and _hidden(tmp_path) == []


def test_sigterm_stops_the_run_closes_the_cluster_and_removes_the_spool(tmp_path):
    corpus = _long_corpus(tmp_path)
    out = tmp_path / "out.ngst"
    out.write_bytes(b"the previous output")
    proc = _start_create(tmp_path, corpus, out)
    try:
        _wait_for_a_spooled_run(proc, tmp_path)
        proc.send_signal(signal.SIGTERM)  # to the command alone, as `kill PID` sends it
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 143
    assert stderr == "ngramcache create: terminated\n"  # no "leaked semaphore objects", no traceback
    assert out.read_bytes() == b"the previous output" and _hidden(tmp_path) == []


def test_local_workers_ignore_sigint_also_after_a_restart(client):
    def handler():
        return signal.getsignal(signal.SIGINT) == signal.SIG_IGN

    assert set(client.run(handler).values()) == {True}


def test_a_worker_error_is_one_line_without_the_workers_log(tmp_path):
    """The worker's own "Compute Failed" log and traceback stay out of the user's terminal."""
    import subprocess
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc \\xF4\\x90\\x80\\x80 def\n")
    r = subprocess.run([sys.executable, "-m", "ngramcache", "create", "--workers", "1", "-m", smollm2_path(),
                        "-f", str(bad), "-lcs", str(tmp_path / "o.ngst"), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stdout == ""
    [line] = r.stderr.splitlines()
    assert line.startswith(f"ngramcache create: error: {bad}: byte offset 4: ") and "U+110000" in line


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux's /proc/self/mem")
def test_an_unreadable_input_is_named_before_the_cluster_starts(tmp_path, capsys):
    good = tmp_path / "a.txt"
    good.write_text("hello world\n")
    rc, out, err = run_cli(capsys, "create", "--workers", "2", "-m", smollm2_path(), "-f", good,
                           "-f", "/proc/self/mem", "-lcs", tmp_path / "o.ngst")
    assert (rc, out) == (1, "")
    assert err == "ngramcache create: error: /proc/self/mem: Input/output error\n"
    assert "start cluster" not in err and not (tmp_path / "o.ngst").exists()
