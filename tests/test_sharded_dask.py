"""``create --workers`` / ``--scheduler`` on a real Dask LocalCluster of worker processes:
the same bytes as the single-process create, also when a worker is killed mid-run."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from conftest import run_cli, run_json
from test_cli_create import smollm2_path, stdlib_corpus

pytest.importorskip("distributed", reason="the 'distributed' extra (Dask) is not installed")
pytestmark = pytest.mark.model

from ngramcache import sharded  # noqa: E402
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
