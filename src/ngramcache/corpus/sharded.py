"""Counting a corpus in shards on a Dask cluster, and merging counts as sorted runs.

``create`` on one machine tokenizes the whole corpus in one process. Here the input
files are cut into shards (whole files in path order; a long file in parts that end at
the same piece boundaries the single-process path uses, see ``ngramcache.corpus.tokenizers``),
every shard is tokenized and counted by a Dask worker into a *sorted run* (its (n-gram,
next token) counts sorted by key, each with where it was first seen), and the runs are
merged by a streaming k-way merge into one file. The file is byte for byte the one the
single-process ``create`` writes from the same inputs:

* the n-grams that span two shards (the last tokens of one, the first of the next) are
  counted here, from each shard's first and last ``ngram_size`` tokens, into one more run;
* first sightings order the tokens of a key, which decides an NGST best token among
  equal counts and the order of llama.cpp's lookup.bin (docs/parity.md).

``merge_cache_files`` merges cache files the same way: each input, loaded one at a time,
becomes a run, so the merging side never holds more than one input cache at once.

The merging side holds one block of every run (up to ``MAX_BLOCK_ENTRIES`` entries of
40 bytes, 2.5 MiB, a run; smaller blocks when there are many runs, so that all of them
together stay within ``BLOCK_BUDGET_BYTES``, 256 MiB, down to ``MIN_BLOCK_ENTRIES``, 160 KiB,
a run), the entries of one key, and per key 8 bytes for an NGST file (plus the
image itself, the size of the output) or about 50 bytes for a lookup.bin (first sighting,
hash, spool offset, and llama.cpp's map order). The runs themselves are spooled to a
hidden folder beside the output as they arrive from the workers, one at a time (a folder
that a killed run leaves behind is removed by the next one: ``ngramcache.corpus.spool``).
"""

from __future__ import annotations

import contextlib
import os
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ngramcache import _core
from ngramcache._validate import NGRAM_MAX, check_int
from ngramcache.corpus._workers import children_ignore_sigint
from ngramcache.corpus.spool import spool_folder

__all__ = ["Shard", "ShardCounts", "plan_shards", "tokenize_shard", "count_shard", "shard_counts", "boundary_run",
           "merge_runs", "create_sharded", "merge_cache_files", "local_client", "connect", "close_client"]

RUN_ENTRY_BYTES = 40
MAX_BLOCK_ENTRIES = 1 << 16
MIN_BLOCK_ENTRIES = 1 << 12
BLOCK_BUDGET_BYTES = 256 << 20
MAX_RUNS = (1 << 24) - 1  # a run's rank is 24 bits of each first sighting
RUN_HEADER = struct.Struct("<4sI I4x Q Q")  # magic, version, n-gram sizes bitmask, entries, total
MIN_SHARD_BYTES = 256 << 10
MAX_SHARD_BYTES = 64 << 20
SHARDS_PER_WORKER = 4  # a few per worker, so a slow or lost shard delays the end little

DASK_MISSING = "--workers and --scheduler need Dask: pip install 'ngramcache[distributed]'"


# ----------------------------------------------------------------------------------------
# Shards
# ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shard:
    """Consecutive inputs: ``parts`` lists (path, part, of_parts); a file of one part is
    read whole, else part k of K holds the k-th of K equal runs of its pieces."""
    rank: int
    parts: tuple[tuple[str, int, int], ...]
    nbytes: int


def default_shard_bytes(total_bytes: int, n_workers: int) -> int:
    per = -(-total_bytes // max(1, SHARDS_PER_WORKER * n_workers))
    return min(MAX_SHARD_BYTES, max(MIN_SHARD_BYTES, per))


def plan_shards(files: Sequence[os.PathLike | str], shard_bytes: int) -> list[Shard]:
    """Cut ``files`` (in this order) into shards of about ``shard_bytes``: small files
    grouped, a file larger than that split into parts of about that size. Paths become
    absolute: workers elsewhere open them in another working directory."""
    if shard_bytes < 1:
        raise ValueError(f"shard_bytes must be at least 1, got {shard_bytes}")
    shards: list[Shard] = []
    group: list[tuple[str, int, int]] = []
    group_bytes = 0

    def close_group():
        nonlocal group, group_bytes
        if group:
            shards.append(Shard(len(shards), tuple(group), group_bytes))
        group, group_bytes = [], 0

    for f in map(os.path.abspath, files):
        size = os.path.getsize(f)
        if size > shard_bytes:
            close_group()
            k = -(-size // shard_bytes)
            for part in range(k):
                shards.append(Shard(len(shards), ((str(f), part, k),), size // k + (part < size % k)))
            continue
        group.append((str(f), 0, 1))
        group_bytes += size
        if group_bytes >= shard_bytes:
            close_group()
    close_group()
    return shards


# ----------------------------------------------------------------------------------------
# The worker's side
# ----------------------------------------------------------------------------------------

_TOKENIZERS: dict = {}


def _tokenizer(spec: tuple[str, str]):
    # One per worker process: loading a vocabulary costs far more than a small shard.
    tok = _TOKENIZERS.get(spec)
    if tok is None:
        from ngramcache.corpus.tokenizers import _open_spec
        tok = _TOKENIZERS[spec] = _open_spec(spec)
    return tok


def tokenize_shard(shard: Shard, tok, escape: bool, piece_bytes: int) -> np.ndarray:
    """The shard's tokens: exactly its slice of what ``tokenize_files`` gives for all the
    inputs with the same ``piece_bytes``."""
    from ngramcache.corpus.text import prepare_text, read_input, split_pieces
    from ngramcache.corpus.tokenizers import HFTokenizer, _add_text, _Pipeline

    pipe = _Pipeline(tok, 1)
    for path, part, of_parts in shard.parts:
        data = read_input(path)
        text = prepare_text(data, escape, path, check=tok.rejects_above_max_codepoint)
        del data
        pieces = split_pieces(text, piece_bytes) if tok.prefix is not None else [text]
        if of_parts == 1 or len(pieces) == 1:
            if part == 0:  # the whole file, as tokenize_files does it
                _add_text(pipe, text, len(text), tok, piece_bytes, None)
            continue
        lo, hi = part * len(pieces) // of_parts, (part + 1) * len(pieces) // of_parts
        if part == 0:
            pipe.add(None, literal=tok.prefix)
        mine = pieces[lo:hi]
        if isinstance(tok, HFTokenizer):
            for ids in tok.tokenize_pieces(mine):
                pipe.add(None, literal=ids)
        else:
            for piece in mine:
                pipe.add(piece, add_special=False)
        if part == of_parts - 1:
            pipe.add(None, literal=tok.suffix)
    return pipe.finish(None)


@dataclass
class ShardCounts:
    """What a worker sends back: the run, the token count and the shard's first and last
    ``ngram_size`` tokens (for the n-grams that span shards)."""
    rank: int
    run: bytes
    n_tokens: int
    head: np.ndarray
    tail: np.ndarray


def count_shard(shard: Shard, tokenizer_spec: tuple[str, str], escape: bool, piece_bytes: int,
                ngram_size: int) -> ShardCounts:
    """Tokenize a shard and count the n-grams that lie wholly inside it (runs on a worker)."""
    tokens = tokenize_shard(shard, _tokenizer(tuple(tokenizer_spec)), escape, piece_bytes)
    return shard_counts(shard.rank, tokens, ngram_size)


def shard_counts(rank: int, tokens: np.ndarray, ngram_size: int) -> ShardCounts:
    """The run of the observations inside the ``rank``-th shard's ``tokens`` (int32)."""
    n = ngram_size
    run = _core.run_from_tokens([(tokens, rank, n, n)], n)
    return ShardCounts(rank, run, int(tokens.size), tokens[:n].copy(), tokens[max(0, tokens.size - n):].copy())


def boundary_run(counts: Sequence[ShardCounts], ngram_size: int) -> bytes:
    """The observations whose next token is among a shard's first ``ngram_size`` tokens
    and whose n-gram reaches back into earlier shards, as one run."""
    n = ngram_size
    before = np.zeros(0, dtype=np.int32)  # the last n tokens before the current shard
    stretches = []
    for c in sorted(counts, key=lambda c: c.rank):
        if before.size:
            seq = np.ascontiguousarray(np.concatenate([before, c.head]), dtype=np.int32)
            stretches.append((seq, c.rank, before.size, 0))
        before = np.concatenate([before, c.tail])[-n:]
    return _core.run_from_tokens(stretches, n)


# ----------------------------------------------------------------------------------------
# Runs and their merge
# ----------------------------------------------------------------------------------------

def run_header(path: str | os.PathLike) -> dict:
    """A run file's header: n-gram sizes present, entries, total count."""
    with open(path, "rb") as f:
        magic, version, sizes, entries, total = RUN_HEADER.unpack(f.read(RUN_HEADER.size))
    return {"sizes": [n for n in range(1, 5) if sizes >> n & 1], "entries": entries, "total": total}


def _write_run(path: Path, run: bytes) -> None:
    with open(path, "wb") as f:
        f.write(run)


def block_entries(n_runs: int) -> int:
    """Entries read at once from each of ``n_runs`` runs."""
    fit = BLOCK_BUDGET_BYTES // (RUN_ENTRY_BYTES * max(1, n_runs))
    return max(MIN_BLOCK_ENTRIES, min(MAX_BLOCK_ENTRIES, fit))


def merge_runs(paths: Sequence[str | os.PathLike], out: str | os.PathLike, fmt: str, *, from_tokens: bool,
               ngram_size: int = 0, spool: str | os.PathLike | None = None) -> dict:
    """Merge run files into ``out`` (written atomically) as an NGST table (``fmt="ngst"``;
    best tokens as ``StaticTable.build`` picks them when ``from_tokens``, else as
    ``StaticTable.from_cache`` does) or a llama.cpp lookup.bin (``fmt="llama"``).
    ``ngram_size``: the size of every key (0: the runs' own, 2 when they are empty).
    ``spool``: a folder for the lookup.bin's temporary records (default: a spool folder
    of its own beside ``out``, see ``ngramcache.corpus.spool``).
    Returns the result's {"keys", "entries", "total_count"}."""
    paths = [os.fspath(p) for p in paths]
    out = os.fspath(out)
    block = block_entries(len(paths))
    if fmt == "ngst":
        figures = _core.merge_runs_ngst(paths, out, ngram_size, from_tokens, block)
    elif fmt == "llama":
        with contextlib.ExitStack() as stack:
            folder = Path(spool) if spool is not None else stack.enter_context(spool_folder(out))
            records = folder / f"merge-{uuid.uuid4().hex}.records"
            stack.callback(lambda: records.unlink(missing_ok=True))
            figures = _core.merge_runs_lookup(paths, out, os.fspath(records), block)
    else:
        raise ValueError(f"fmt must be 'ngst' or 'llama', got {fmt!r}")
    return dict(zip(("keys", "entries", "total_count"), map(int, figures)))


# ----------------------------------------------------------------------------------------
# Dask
# ----------------------------------------------------------------------------------------

def _distributed():
    try:
        import distributed
    except ImportError:
        raise ImportError(DASK_MISSING) from None
    return distributed


def local_client(n_workers: int):
    """A Client of a new LocalCluster of ``n_workers`` single-threaded worker processes;
    :func:`close_client` closes both. The workers log nothing (a failed task reaches the
    client as its exception) and ignore SIGINT: a Ctrl-C to the process group interrupts
    this process alone, which then closes the cluster."""
    import logging

    distributed = _distributed()
    with children_ignore_sigint():
        # Port 0 for the scheduler's web server: another cluster on this machine may hold
        # the default port.
        cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                           dashboard_address=":0", silence_logs=logging.CRITICAL,
                                           preload=["ngramcache.corpus._workers"])
    client = distributed.Client(cluster)
    client._ngramcache_cluster = cluster  # closed together
    return client


def connect(address: str, timeout: float = 30):
    """A Client of the running scheduler at ``address`` (e.g. ``tcp://host:8786``)."""
    distributed = _distributed()
    try:
        return distributed.Client(address, timeout=timeout)
    except (OSError, TimeoutError) as e:
        raise OSError(f"cannot reach the Dask scheduler at {address}: {e}") from None


def close_client(client) -> None:
    """Close a client, and the local cluster :func:`local_client` started for it."""
    cluster = getattr(client, "_ngramcache_cluster", None)
    client.close()
    if cluster is not None:
        cluster.close()


def worker_slots(client) -> int:
    """Tasks the cluster runs at once: its workers' threads."""
    return max(1, sum(client.nthreads().values()))


def _collect_runs(client, shards: list[Shard], spool: Path, args: tuple, progress) -> list[ShardCounts]:
    """Submit every shard, spool each run as it arrives and let its worker drop it."""
    distributed = _distributed()
    run_id = uuid.uuid4().hex[:12]
    futures = [client.submit(count_shard, s, *args, key=f"ngramcache-count-{run_id}-{s.rank}", pure=False)
               for s in shards]
    counts = []
    try:
        for fut in distributed.as_completed(futures):
            try:
                c = fut.result()
            except distributed.KilledWorker:
                shard = shards[futures.index(fut)]
                raise RuntimeError(
                    f"shard {shard.rank} ({_describe(shard)}) took down every worker that ran it "
                    f"(out of memory? try a smaller --shard-size)") from None
            except distributed.client.FutureCancelledError:
                raise RuntimeError("the Dask cluster cancelled the work (scheduler or client gone)") from None
            fut.release()
            _write_run(spool / f"shard-{c.rank:06d}.run", c.run)
            c.run = b""  # the spooled file holds it now
            counts.append(c)
            if progress is not None:
                progress.update(shards[c.rank].nbytes)
    finally:
        for fut in futures:
            fut.cancel()
    return counts


def _describe(shard: Shard) -> str:
    path, part, of_parts = shard.parts[0]
    first = f"{path} part {part + 1} of {of_parts}" if of_parts > 1 else path
    return first if len(shard.parts) == 1 else f"{first} and {len(shard.parts) - 1} more files"


def create_sharded(files: Sequence[str | os.PathLike], out: str | os.PathLike, fmt: str, client, *,
                   tokenizer_spec: tuple[str, str], escape: bool = True, piece_bytes: int | None = None,
                   shard_bytes: int | None = None, ngram_size: int = 2, progress=None, timer=None,
                   save=None) -> dict:
    """Count ``files`` on the workers of ``client`` and write the static cache ``out``
    (``fmt``: "ngst" or "llama"), byte for byte what the single-process ``create``
    writes. Returns {"tokens", "shards", "keys", "entries", "total_count"}.
    ``progress.update(n_bytes)`` is called as each shard's run arrives; ``timer`` (a
    ``Timer`` of ngramcache.commands) times the stages "count shards" and "merge".
    ``save(fn, *args, **kwargs)`` runs the final merge, which writes ``out`` (default: a
    plain call; the command passes one that Ctrl-C stops before the rename)."""
    from ngramcache.corpus.text import DEFAULT_PIECE_BYTES

    if fmt not in ("ngst", "llama"):
        raise ValueError(f"fmt must be 'ngst' or 'llama', got {fmt!r}")
    ngram_size = check_int("ngram_size", ngram_size, 1, NGRAM_MAX)
    piece_bytes = check_int("piece_bytes", piece_bytes, 0, none_ok=True)
    shard_bytes = check_int("shard_bytes", shard_bytes, 1, none_ok=True)
    piece_bytes = DEFAULT_PIECE_BYTES if piece_bytes is None else piece_bytes
    if shard_bytes is None:
        total_bytes = sum(os.path.getsize(f) for f in files)
        shard_bytes = default_shard_bytes(total_bytes, worker_slots(client))
    shards = plan_shards(files, shard_bytes)
    if len(shards) > MAX_RUNS:
        raise ValueError(f"{len(shards):,} shards, more than the {MAX_RUNS:,} a merge can rank: "
                         f"use larger shards (shard_bytes, --shard-size)")
    stage = timer.stage if timer is not None else (lambda name: contextlib.nullcontext())
    with spool_folder(out) as spool:
        with stage("count shards"):
            kind, tok_path = tokenizer_spec
            counts = _collect_runs(client, shards, spool,
                                   ((kind, os.path.abspath(tok_path)), escape, piece_bytes, ngram_size), progress)
        with stage("merge"):
            edge = spool / "boundaries.run"
            _write_run(edge, boundary_run(counts, ngram_size))
            figures = (save or _call)(merge_runs, sorted(spool.glob("*.run")), out, fmt, from_tokens=True,
                                      ngram_size=ngram_size, spool=spool)
    return {"tokens": sum(c.n_tokens for c in counts), "shards": len(shards), **figures}


def _call(fn, *args, **kwargs):
    return fn(*args, **kwargs)


# ----------------------------------------------------------------------------------------
# Merging cache files
# ----------------------------------------------------------------------------------------

def merge_cache_files(inputs: Sequence[str | os.PathLike], out: str | os.PathLike, fmt: str, progress=None,
                      timer=None) -> dict:
    """What ``NgramCache`` merges of the inputs (in order, either format) write, byte for
    byte, holding one input in memory at a time. Returns {"keys", "entries",
    "total_count"} of the result. ``progress.update(1)`` is called as each input is read;
    ``timer`` times the stages "read inputs" and "merge"."""
    stage = timer.stage if timer is not None else (lambda name: contextlib.nullcontext())
    with spool_folder(out) as spool:
        with stage("read inputs"):
            paths = _runs_of_inputs(inputs, spool, progress)
        sizes = sorted({n for p in paths for n in run_header(p)["sizes"]})
        if fmt == "ngst" and len(sizes) > 1:
            raise ValueError(f"a static table (.ngst) holds n-grams of one size, these counts have sizes "
                             f"{', '.join(map(str, sizes))} (a context or dynamic cache?): write a llama.cpp "
                             f".bin file instead")
        with stage("merge"):
            return merge_runs(paths, out, fmt, from_tokens=False, spool=spool)


def _runs_of_inputs(inputs, spool: Path, progress) -> list[Path]:
    """Each input cache as a run file, loaded one at a time: the merge's starting cache
    ranked in insertion order, the others in the order a merge walks them."""
    from ngramcache.files import load_counts

    if len(inputs) > MAX_RUNS:
        raise ValueError(f"{len(inputs):,} inputs, more than the {MAX_RUNS:,} a merge can rank")
    paths = []
    for rank, path in enumerate(inputs):
        cache = load_counts(path)
        run_path = spool / f"input-{rank:06d}.run"
        _core.save_run_from_cache(cache._impl, rank, rank > 0, os.fspath(run_path))
        del cache
        paths.append(run_path)
        if progress is not None:
            progress.update(1)
    return paths
