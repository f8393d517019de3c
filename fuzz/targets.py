"""The Python-level fuzz targets: one function per file format or entry point, taking the
fuzz input's bytes. A target returns normally when the input met the acceptable-outcome
rule (a clean result, or the clear exception documented for bad input) and raises
anything else: a ``Finding`` for a broken property, or the unexpected exception itself.

The atheris driver (``fuzz/py_fuzz.py``) runs them under coverage feedback; the normal
test run (``tests/test_fuzz_corpus.py``) replays the committed corpus and crashers
through the same functions, without atheris.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np

import ngramcache
from ngramcache import CacheFormatError, NgramCache, StaticTable


class Finding(AssertionError):
    """A property of a target did not hold for this input."""


def require(ok: bool, what: str) -> None:
    if not ok:
        raise Finding(what)


class Bytes:
    """Reads a fuzz input front to back; past its end every read gives zeros (so that any
    input, even an empty one, decodes to something)."""

    def __init__(self, data: bytes):
        self.data = data
        self.at = 0

    def byte(self) -> int:
        b = self.data[self.at] if self.at < len(self.data) else 0
        self.at += 1
        return b

    def take(self, n: int) -> bytes:
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def rest(self) -> bytes:
        out = self.data[self.at:]
        self.at = len(self.data)
        return out


_scratch: Path | None = None


def scratch() -> Path:
    """A private folder for the files a target writes, made once per process and removed
    at exit."""
    global _scratch
    if _scratch is None:
        import atexit

        _scratch = Path(tempfile.mkdtemp(prefix="ngramcache-fuzz-"))
        atexit.register(shutil.rmtree, _scratch, True)
    return _scratch


def _write(name: str, data: bytes) -> Path:
    path = scratch() / name
    path.write_bytes(data)
    return path


def _clear_message(e: BaseException) -> None:
    require(bool(str(e).strip()), f"{type(e).__name__} without a message")


# ----------------------------------------------------------------------------------------
# token files: raw int32 and .npy (ngramcache.files.read_tokens_file)
# ----------------------------------------------------------------------------------------

def tokens_file(data: bytes) -> None:
    """``read_tokens_file`` on the input written as a file: token ids (1-D int32, C order,
    none negative) or ValueError. A raw file (no .npy magic) reads as its int32 words."""
    from ngramcache.files import read_tokens_file

    path = _write("tokens.npy" if data[:1] == b"\x93" else "tokens.i32", data)
    try:
        toks = read_tokens_file(path)
    except ValueError as e:
        _clear_message(e)
        return
    require(isinstance(toks, np.ndarray) and toks.dtype == np.int32 and toks.ndim == 1, "not a 1-D int32 array")
    require(toks.flags.c_contiguous, "token array not C-contiguous")
    require(toks.size == 0 or int(toks.min()) >= 0, "negative token id accepted")
    if not data.startswith(b"\x93NUMPY"):
        require(np.array_equal(toks, np.frombuffer(data, dtype="<i4")), "raw token file read wrongly")


# ----------------------------------------------------------------------------------------
# cache files of either format, through the public API (ngramcache.files.open_cache)
# ----------------------------------------------------------------------------------------

def _draft_with(data: bytes, **caches) -> None:
    inp = [b % 64 for b in data[-8:]] or [0, 1]
    ctx = NgramCache()
    ctx.update(inp, 1, 4)
    out = ngramcache.draft(inp, 8, ctx, **caches)
    require(len(out) <= 8 and all(t >= 0 for t in out), "draft out of bounds")


def cache_files(data: bytes) -> None:
    """``open_cache`` on the input as a file, then what the CLI does with what it opened:
    an NgramCache or a StaticTable, or CacheFormatError. A table that opens answers
    lookups and drafts, and either passes ``verify`` (then converts) or raises
    CacheFormatError; a cache that loads saves to the same bytes it reloads from."""
    from ngramcache.files import open_cache

    path = _write("cache.ngst" if data[:4] == b"NGST" else "cache.bin", data)
    head = None
    if data[:4] == b"NGST":  # what `info` reads: the header alone, as strict as open
        try:
            head = StaticTable.read_header(path)
        except CacheFormatError as e:
            _clear_message(e)
    try:
        opened = open_cache(path)
    except CacheFormatError as e:
        _clear_message(e)
        require(head is None, "read_header accepts a table that open refuses")
        return
    if isinstance(opened, StaticTable):
        require(head is not None and head["n_keys"] == len(opened), "read_header and open disagree")
        opened.arrays()
        if opened.ngram_size == 2:
            _draft_with(data, static=opened)
        try:
            opened.verify()
        except CacheFormatError as e:
            _clear_message(e)
            return
        back = opened.to_cache()
        require(sum(len(c) for _, c in back.items()) == opened.n_entries, "a verified table converts to other counts")
        require(StaticTable.from_bytes(opened.to_bytes()).n_keys == opened.n_keys, "image does not reopen")
        return
    require(isinstance(opened, NgramCache), f"open_cache returned {type(opened).__name__}")
    again = NgramCache.from_bytes(opened.to_bytes())
    require(dict(again.items()) == dict(opened.items()), "a saved cache reloads to other counts")
    _draft_with(data, dynamic=opened, static=opened)
    try:
        table = StaticTable.from_llama(path)
    except ValueError as e:  # CacheFormatError, or n-grams of several sizes
        _clear_message(e)
        return
    table.verify()


# ----------------------------------------------------------------------------------------
# saved state: SuffixStore, NgramModTable and the server's memory file
# ----------------------------------------------------------------------------------------

# The vocabulary the memory files of the corpus were saved with.
MEMORY_VOCAB = 512
MEMORY_FINGERPRINT = bytes(range(32))

STATE_KINDS = ("suffix_store", "ngram_mod", "server_memory")


def state_input(kind: str, file: bytes, fix_crc: bool = True) -> bytes:
    """The fuzz input for a saved file of ``kind``: a selector byte, then the file less its
    CRC-32 when ``fix_crc`` (the target appends the right one, so that mutations reach
    past the checksum)."""
    sel = STATE_KINDS.index(kind) | (0x80 if fix_crc else 0)
    return bytes([sel]) + (file[:-4] if fix_crc else file)


def saved_state(data: bytes) -> None:
    """``SuffixStore.load``, ``NgramModTable.load`` or ``Memory.load`` (the first byte
    chooses; its top bit asks for the CRC-32 to be appended) on the rest of the input:
    the loaded object, or CacheFormatError. What loads saves and loads back the same."""
    from ngramcache.serving.engine import Memory
    from ngramcache.drafters.llama_ngram import NgramModTable
    from ngramcache.drafters.suffix import SuffixStore

    r = Bytes(data)
    sel = r.byte()
    body = r.rest()
    kind = STATE_KINDS[(sel & 0x7F) % len(STATE_KINDS)]
    file = body + struct.pack("<I", zlib.crc32(body)) if sel & 0x80 else body
    path = _write(kind, file)
    try:
        if kind == "suffix_store":
            obj = SuffixStore.load(path)
        elif kind == "ngram_mod":
            obj = NgramModTable.load(path)
        else:
            obj = Memory.load(path, MEMORY_VOCAB, MEMORY_FINGERPRINT, max_tokens=4096)
    except CacheFormatError as e:
        _clear_message(e)
        return
    again = scratch() / (kind + ".again")
    if kind == "suffix_store":
        obj.save(again)
        back = SuffixStore.load(again)
        require(len(back.requests()) == len(obj.requests()), "suffix store changed through save and load")
        require(all(np.array_equal(a, b) for a, b in zip(back.requests(), obj.requests())),
                "suffix store requests changed through save and load")
    elif kind == "ngram_mod":
        obj.save(again)
        require(again.read_bytes() == file, "ngram-mod table saves to other bytes than it loaded from")
    else:
        obj.save(again, MEMORY_VOCAB, MEMORY_FINGERPRINT)
        back = Memory.load(again, MEMORY_VOCAB, MEMORY_FINGERPRINT, max_tokens=4096)
        require(back.n_requests == obj.n_requests, "server memory changed through save and load")


# ----------------------------------------------------------------------------------------
# the verification-cost store (llama.load_costs / store_costs): JSON in the user's cache
# ----------------------------------------------------------------------------------------

COST_KEY = b"@KEY@"


def cost_store(data: bytes) -> None:
    """``load_costs`` on the input as the store (``@KEY@`` stands for the key of a model
    file, which no mutation would guess): None or a list of positive finite costs; then
    ``store_costs`` replaces a damaged store, and the costs it stored load back."""
    import json
    import math

    from ngramcache.integrations import llama_costs

    model = scratch() / "model.gguf"
    if not model.exists():
        model.write_bytes(b"GGUF")
    key = json.dumps(llama_costs._cost_key(str(model), 2, 2))[1:-1].encode()
    path = _write("costs.json", data.replace(COST_KEY, key))
    costs = llama_costs.load_costs(str(model), 2, 2, str(path))
    require(costs is None or (isinstance(costs, list) and costs and
                              all(isinstance(c, float) and math.isfinite(c) and c > 0 for c in costs)),
            f"load_costs returned {costs!r}")
    llama_costs.store_costs(str(model), 2, 2, [0.25, 0.5], str(path))
    require(llama_costs.load_costs(str(model), 2, 2, str(path)) == [0.25, 0.5], "stored costs do not load back")


# ----------------------------------------------------------------------------------------
# the command line, in-process
# ----------------------------------------------------------------------------------------

class ModelBoundary(Exception):
    """Raised where a command would load a model or tokenizer: the fuzzed run stops there
    (models are slow, and the packaged ones may not be installed)."""


@contextlib.contextmanager
def _models_replaced_by_a_boundary():
    """The model and tokenizer loaders raise ModelBoundary for the length of one run, and
    only then: the normal test run replays this target beside tests that load models."""
    import ngramcache.models
    import ngramcache.corpus.tokenizers

    def boundary(*args, **kwargs):
        raise ModelBoundary()

    saved = ngramcache.models.model_path, ngramcache.corpus.tokenizers.load_tokenizer
    ngramcache.models.model_path = ngramcache.corpus.tokenizers.load_tokenizer = boundary
    try:
        yield
    finally:
        ngramcache.models.model_path, ngramcache.corpus.tokenizers.load_tokenizer = saved


_CLI_COMMANDS = ("create", "merge", "convert", "info", "stats", "generate", "demo", "serve", "chat")
_FIXED_FILES = ("good.bin", "good.ngst", "tokens.i32", "tokens.npy", "text.txt", "fuzz.dat")
_CLI_PATHS = _FIXED_FILES + ("folder", "missing.bin", "out.bin", "out.ngst", ".")
_cli_state: dict = {}


def _cli_setup() -> dict:
    """Once per process: the command parsers' flags, the model loaders replaced by a
    boundary, and a folder of small valid files the argv can name."""
    if _cli_state:
        return _cli_state
    import argparse

    from ngramcache.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {name: sorted(s for a in p._actions for s in a.option_strings) for name, p in sub.choices.items()}

    work = scratch() / "cli"
    work.mkdir()
    toks = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 6, 1, 2, 3], dtype=np.int32)
    cache = NgramCache()
    cache.update(toks, 1, 4)
    (work / "good.bin").write_bytes(cache.to_bytes())
    (work / "good.ngst").write_bytes(StaticTable.build(toks, 2).to_bytes())
    (work / "tokens.i32").write_bytes(toks.astype("<i4").tobytes())
    np.save(work / "tokens.npy", toks.astype(np.int64))
    (work / "text.txt").write_text("the cat sat\\non the mat\\x41\n")
    (work / "folder").mkdir()
    (work / "folder" / "a.txt").write_text("abc\n")
    # kept to rewrite before every run: a run may overwrite them (e.g. convert A A)
    fixed = {name: (work / name).read_bytes() for name in _FIXED_FILES if (work / name).exists()}
    _cli_state.update(flags=flags, work=work, fixed=fixed)
    return _cli_state


def _arg_text(raw: bytes) -> str:
    # A real argv holds no NUL byte; a slash would let an output path leave the folder.
    return raw.replace(b"\0", b"").replace(b"/", b"_").decode("utf-8", "surrogateescape")


def cli_argv(data: bytes) -> tuple[list[str], bytes]:
    """The argv a fuzz input describes, and the content of its file ``fuzz.dat``: a
    command, then up to 15 arguments, each a flag of that command, a file of the folder
    (valid, the input's own, missing, an output), a number or a short text."""
    st = _cli_setup()
    r = Bytes(data)
    cmd = _CLI_COMMANDS[r.byte() % len(_CLI_COMMANDS)]
    flags = st["flags"][cmd]
    argv = [cmd]
    for _ in range(r.byte() % 16):
        kind = r.byte() % 8
        if kind in (0, 1, 2):
            argv.append(flags[r.byte() % len(flags)])
        elif kind == 3:
            argv.append(_CLI_PATHS[r.byte() % len(_CLI_PATHS)])
        elif kind == 4:
            argv.append(str(int.from_bytes(r.take(2).ljust(2, b"\0"), "little", signed=True)))
        elif kind == 5:
            argv.append(("0", "1", "-1", "2", "4", "0.5", "nan", "inf", "1e9", "")[r.byte() % 10])
        else:
            argv.append(_arg_text(r.take(r.byte() % 24)))
    return argv, r.rest()


def cli_input(argv: list[str], content: bytes = b"") -> bytes:
    """The fuzz input that ``cli_argv`` decodes to ``argv`` and ``content`` (for seeds):
    every argument a flag, a file of the folder or a text."""
    flags = _cli_setup()["flags"][argv[0]]
    out = bytearray([_CLI_COMMANDS.index(argv[0]), len(argv) - 1])
    for a in argv[1:]:
        if a in flags:
            out += bytes([0, flags.index(a)])
        elif a in _CLI_PATHS:
            out += bytes([3, _CLI_PATHS.index(a)])
        else:
            raw = a.encode()
            assert len(raw) < 24 and b"/" not in raw, a
            out += bytes([6, len(raw)]) + raw
    assert len(argv) <= 16
    return bytes(out) + content


def cli(data: bytes) -> None:
    """``ngramcache.cli.main.main`` on the argv of ``cli_argv``, run in the folder of small
    files: the only acceptable outcomes are a clean exit, a usage error (status 2) and
    a one-line error (status 1); any other exception or a traceback is a finding."""
    from ngramcache import cli as cli_module

    st = _cli_setup()
    work: Path = st["work"]
    argv, content = cli_argv(data)
    for name, body in st["fixed"].items():
        (work / name).write_bytes(body)
    (work / "fuzz.dat").write_bytes(content)
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _models_replaced_by_a_boundary():
            try:
                status = cli_module.main(argv)
            except SystemExit as e:  # argparse: --help (0) or a usage error (2)
                status = e.code
            except ModelBoundary:
                return
    finally:
        os.chdir(cwd)
        for p in work.iterdir():  # outputs of this run go, the fixed files stay
            if p.name not in _FIXED_FILES and p.name != "folder":
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    text = err.getvalue()
    require("Traceback" not in text, f"traceback on stderr for {argv!r}:\n{text}")
    require(status in (0, 1, 2, None), f"exit status {status!r} for {argv!r}")
    if status == 1:
        last = text.rstrip("\n").rsplit("\n", 1)[-1]
        require(last.startswith(f"ngramcache {argv[0]}: error: ") and len(last) > 30,
                f"status 1 without a one-line error for {argv!r}:\n{text}")


def warm_up() -> None:
    """Imports everything the targets use (for instrumentation that sees loaded code)."""
    import ngramcache.cli.main  # noqa: F401
    import ngramcache.files  # noqa: F401
    import ngramcache.integrations.llama  # noqa: F401
    import ngramcache.serving.engine  # noqa: F401
    import ngramcache.drafters.llama_ngram  # noqa: F401
    import ngramcache.drafters.suffix  # noqa: F401

    _cli_setup()
    for name in _CLI_COMMANDS:
        __import__(f"ngramcache.commands.{name}")


TARGETS = {
    "tokens_file": tokens_file,
    "cache_files": cache_files,
    "saved_state": saved_state,
    "cost_store": cost_store,
    "cli": cli,
}
