"""Tokenizers, and text to tokens exactly as llama.cpp's lookup tools turn a ``-f FILE``
into tokens (the text rules are in ``ngramcache.corpus.text``).

:func:`tokenize_text` does exactly that in one tokenizer call. :func:`tokenize_files`
does it for many files, and for speed may tokenize each file in pieces:

Piecewise tokenization
----------------------
Some tokenizers slow down super-linearly on long inputs (Gemma 3's: 64 KB at 64k
tokens/s, 1 MB at 7k tokens/s), so long texts are cut into pieces of at most
``piece_bytes`` (64 KiB by default) and the pieces are tokenized in parallel worker
processes. Pieces are cut only right after a lone ``\\n`` between two bytes that are not
whitespace (such as the end of a line followed by an unindented line), and the model's special prefix/suffix
tokens (BOS/EOS) are added once per file, not once per piece. For tokenizers that
pre-split text with a regular expression (GPT-2 style BPE, e.g. SmolLM2's) no token can
span such a point, and the result equals llama.cpp's single call. It can differ where:

* a SentencePiece-style tokenizer (Gemma's) has vocabulary entries that merge across the
  cut, e.g. a newline together with the following word: the single call may produce one
  such token where the pieces produce two;
* a special token's text contains a newline followed by a non-space character (it would
  not be recognised across the cut);
* a tokenizer adds a space prefix to the start of every text it is given
  (``add_space_prefix``, as in Llama 1/2): each piece would get one.

The difference is confined to the tokens at the cut points (one in several thousand
tokens), and it affects counts, never correctness of a cache. Pass ``piece_bytes=0``
(CLI: ``--piece-size 0``) for one call per file, which is exactly llama.cpp's result.

Several files are tokenized one by one, each as llama.cpp would tokenize that file alone
(its own trailing-newline rule, escapes and BOS), and their tokens are concatenated in the
order given.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Iterable, Sequence

import numpy as np

from ngramcache._validate import as_tokens, check_int
from ngramcache.files import expand_inputs
from ngramcache.models import model_path, usable_cpus
from ngramcache.corpus.text import DEFAULT_PIECE_BYTES, prepare_text, read_input, split_pieces

__all__ = ["GGUFTokenizer", "HFTokenizer", "load_tokenizer", "tokenize_text", "tokenize_files", "default_jobs"]

# Below this much text, starting worker processes costs more than it saves.
PARALLEL_MIN_BYTES = 1 << 20


class _Base:
    kind = "?"
    path = ""
    #: checks llama.cpp's invalid code point hazard before tokenizing
    rejects_above_max_codepoint = False

    def tokenize(self, text: bytes, add_special: bool = True) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    @property
    def spec(self) -> tuple[str, str]:
        """What a worker process needs to open the same tokenizer."""
        return (self.kind, self.path)

    def _probe_specials(self) -> None:
        """What ``add_special`` adds before and after a text (BOS, EOS, CLS/SEP...)."""
        with_ = self.tokenize(b"a", add_special=True).tolist()
        without = self.tokenize(b"a", add_special=False).tolist()
        k = len(without)
        for i in range(len(with_) - k + 1):
            if with_[i:i + k] == without:
                self.prefix = np.asarray(with_[:i], dtype=np.int32)
                self.suffix = np.asarray(with_[i + k:], dtype=np.int32)
                return
        # The specials change the body itself: piecewise tokenization cannot add them
        # around pieces, so callers must tokenize whole texts.
        self.prefix = self.suffix = None

    def tokenize_pieces(self, pieces: Sequence[bytes]) -> list[np.ndarray]:
        return [self.tokenize(p, add_special=False) for p in pieces]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path}>"


def _silence_llama_log(llama_cpp):
    """Route llama.cpp's log into a list while loading (returns the list and a restore fn)."""
    messages: list[str] = []

    @llama_cpp.llama_log_callback
    def _collect(level, text, user_data):  # pragma: no cover - called from C
        try:
            messages.append(text.decode("utf-8", "replace"))
        except Exception:
            pass

    llama_cpp.llama_log_set(_collect, None)

    def restore():
        try:
            from llama_cpp import _logger
            llama_cpp.llama_log_set(_logger.llama_log_callback, None)
        except Exception:  # pragma: no cover - older/newer layouts
            pass

    return messages, restore, _collect


_LLAMA_VOCAB_TYPE_SPM = 1
_LOAD_LOCK = threading.Lock()


class GGUFTokenizer(_Base):
    """A GGUF model's tokenizer, loaded vocabulary-only through llama-cpp-python (no weights
    are read). ``tokenize(text, add_special)`` is ``llama_tokenize(..., add_special,
    parse_special=True)``, the same call llama.cpp's tools make.

    (``llama_cpp.Llama(..., vocab_only=True).tokenize(text, add_bos=True, special=True)``
    makes the same call: its ``add_bos`` is passed as ``add_special``, which adds BOS only
    if the GGUF asks for it. It is not used here because it also creates a context and
    tokenizes long texts twice: its first buffer is sized by the training context length,
    which is 0 for a vocabulary-only load.)
    """

    kind = "gguf"
    rejects_above_max_codepoint = True

    def __init__(self, path: str | os.PathLike):
        path = os.fspath(path)
        self.path = path
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: model file not found")
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ValueError(f"{path}: not a GGUF model file (it starts with {magic!r}, not b'GGUF')")
        try:
            import llama_cpp
        except ImportError as e:
            raise ImportError(
                f"tokenizing with a GGUF model needs llama-cpp-python ({e}); install it with "
                f"pip install 'ngramcache[llama]', or pass --tokens FILE or --tokenizer tokenizer.json") from None
        self._llama_cpp = llama_cpp
        _backend_init(llama_cpp)
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        # One load at a time: the log callback is process-global.
        with _LOAD_LOCK:
            messages, restore, keep = _silence_llama_log(llama_cpp)
            try:
                model = llama_cpp.llama_model_load_from_file(path.encode(), params)
            finally:
                restore()
                del keep
        if not model:
            errors = [m.strip() for m in messages if "error" in m.lower()]
            detail = f": {errors[-1]}" if errors else ""
            raise ValueError(f"{path}: llama.cpp could not load this model's vocabulary{detail}")
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.vocab_type = int(llama_cpp.llama_vocab_type(self._vocab))
        # The exception comes from re-encoding code points after a pre-tokenizer split
        # (BPE, and the other non-SentencePiece types as far as we know); SentencePiece
        # vocabularies (Gemma's) work on bytes and tokenize such text without complaint.
        self.rejects_above_max_codepoint = self.vocab_type != _LLAMA_VOCAB_TYPE_SPM
        self._probe_specials()

    def tokenize(self, text: bytes, add_special: bool = True, parse_special: bool = True) -> np.ndarray:
        lc = self._llama_cpp
        text = bytes(text)
        # common_tokenize's first guess: one token per byte plus the specials.
        cap = len(text) + 2 * bool(add_special) + 1
        buf = np.empty(cap, dtype=np.int32)
        ptr = buf.ctypes.data_as(lc.ctypes.POINTER(lc.llama_token))
        n = lc.llama_tokenize(self._vocab, text, len(text), ptr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = np.empty(cap, dtype=np.int32)
            ptr = buf.ctypes.data_as(lc.ctypes.POINTER(lc.llama_token))
            n = lc.llama_tokenize(self._vocab, text, len(text), ptr, cap, add_special, parse_special)
            if n < 0:
                raise RuntimeError(f"llama_tokenize failed on {len(text)} bytes (returned {n})")
        return buf[:n].copy() if n < cap // 2 else buf[:n]

    def close(self) -> None:
        model, self._model = getattr(self, "_model", None), None
        if model:
            self._llama_cpp.llama_model_free(model)

    def __del__(self):  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass


_BACKEND_READY = False


def _backend_init(llama_cpp) -> None:
    global _BACKEND_READY
    if not _BACKEND_READY:
        llama_cpp.llama_backend_init()
        _BACKEND_READY = True


class HFTokenizer(_Base):
    """A Hugging Face ``tokenizer.json`` through the ``tokenizers`` package (extra ``hf``).

    Text is decoded as UTF-8 (invalid bytes become U+FFFD, as Python decodes them) and
    encoded with the tokenizer's special tokens added and added/special tokens matched in
    the text, the equivalent of llama.cpp's add_special/parse_special. Pieces are encoded
    with ``encode_batch``, which runs in the library's own threads."""

    kind = "hf"

    def __init__(self, path: str | os.PathLike):
        path = os.fspath(path)
        self.path = path
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: tokenizer file not found")
        try:
            import tokenizers
        except ImportError as e:
            raise ImportError(
                f"--tokenizer needs the Hugging Face 'tokenizers' package ({e}); install it with "
                f"pip install 'ngramcache[hf]'") from None
        try:
            self._tok = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the library raises a bare Exception for bad JSON
            raise ValueError(f"{path}: not a usable tokenizer.json ({e})") from None
        self.n_vocab = int(self._tok.get_vocab_size(with_added_tokens=True))
        self._probe_specials()

    @staticmethod
    def _text(data: bytes) -> str:
        return bytes(data).decode("utf-8", errors="replace")

    @staticmethod
    def _ids(ids) -> np.ndarray:
        return as_tokens(ids, "tokenizer output")

    def tokenize(self, text: bytes, add_special: bool = True) -> np.ndarray:
        return self._ids(self._tok.encode(self._text(text), add_special_tokens=add_special).ids)

    def tokenize_pieces(self, pieces: Sequence[bytes]) -> list[np.ndarray]:
        encs = self._tok.encode_batch([self._text(p) for p in pieces], add_special_tokens=False)
        return [self._ids(e.ids) for e in encs]


def load_tokenizer(model: str | os.PathLike | None = None, tokenizer_json: str | os.PathLike | None = None):
    """A GGUF model's tokenizer (``model``: a path, or a packaged model name, see
    :func:`ngramcache.models.model_path`) or a Hugging Face ``tokenizer.json``: exactly one of them."""
    if (model is None) == (tokenizer_json is None):
        raise ValueError("give exactly one of model (a GGUF file) and tokenizer_json")
    if model is not None:
        return GGUFTokenizer(model_path(model))
    return HFTokenizer(tokenizer_json)


def _open_spec(spec: tuple[str, str]):
    kind, path = spec
    return GGUFTokenizer(path) if kind == "gguf" else HFTokenizer(path)


# ----------------------------------------------------------------------------------------
# Worker processes (one tokenizer per process, loaded once)
# ----------------------------------------------------------------------------------------

_WORKER_TOK = None


def _worker_init(spec: tuple[str, str]) -> None:
    global _WORKER_TOK
    _WORKER_TOK = _open_spec(spec)


def _worker_tokenize(text: bytes, add_special: bool) -> np.ndarray:
    return _WORKER_TOK.tokenize(text, add_special=add_special)


_WORKER_DIED = ("a tokenizer worker process died. If this runs from your own script, guard its entry point "
                "with `if __name__ == \"__main__\":` (worker processes re-import the main module), or pass "
                "jobs=1 (CLI: -j 1) to tokenize in this process")


class _Pipeline:
    """Tokenize a stream of texts in order, in worker processes or inline.

    Workers start on first use, with 'spawn' so they inherit no state (llama.cpp threads,
    a half-initialised tokenizer) and behave the same on every platform. At most a few
    texts per worker are in flight, so memory stays bounded however long the input."""

    def __init__(self, tok, jobs: int):
        self.tok = tok
        self.jobs = jobs
        self._ex: ProcessPoolExecutor | None = None
        self._inflight: deque = deque()
        self.results: list[np.ndarray] = []

    def add(self, text: bytes | None, add_special: bool = False, done_bytes: int = 0, literal=None,
            progress=None) -> None:
        """Queue one text (or a literal token array, e.g. the BOS prefix)."""
        if literal is not None:
            self._inflight.append((None, literal, done_bytes))
        elif self.jobs <= 1:
            self._inflight.append((None, self.tok.tokenize(text, add_special=add_special), done_bytes))
        else:
            if self._ex is None:
                import multiprocessing
                self._ex = ProcessPoolExecutor(max_workers=self.jobs,
                                               mp_context=multiprocessing.get_context("spawn"),
                                               initializer=_worker_init, initargs=(self.tok.spec,))
            self._inflight.append((self._ex.submit(_worker_tokenize, text, add_special), None, done_bytes))
        while len(self._inflight) > 4 * self.jobs:
            self._collect_one(progress)

    def _collect_one(self, progress) -> None:
        fut, arr, done = self._inflight.popleft()
        if fut is not None:
            try:
                arr = fut.result()
            except BrokenProcessPool:
                raise RuntimeError(_WORKER_DIED) from None
        self.results.append(arr)
        if progress is not None and done:
            progress.update(done)

    def finish(self, progress) -> np.ndarray:
        while self._inflight:
            self._collect_one(progress)
        if not self.results:
            return np.zeros(0, dtype=np.int32)
        return np.concatenate(self.results).astype(np.int32, copy=False)

    def close(self) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=True, cancel_futures=True)
            self._ex = None


# ----------------------------------------------------------------------------------------
# Public tokenization entry points
# ----------------------------------------------------------------------------------------

def _add_text(pipe: _Pipeline, text: bytes, raw_size: int, tok, piece_bytes: int, progress) -> None:
    """Queue one prepared text: whole, or as pieces between the specials added once.
    ``raw_size`` (the file's size) is what progress counts, so the bytes the newline and
    escape steps removed count as done too."""
    pieces = split_pieces(text, piece_bytes) if tok.prefix is not None else [text]
    extra = raw_size - len(text)
    if len(pieces) == 1:
        pipe.add(text, add_special=True, done_bytes=raw_size, progress=progress)
        return
    pipe.add(None, literal=tok.prefix, done_bytes=extra, progress=progress)
    if isinstance(tok, HFTokenizer):  # the library's own threads
        for piece, ids in zip(pieces, tok.tokenize_pieces(pieces)):
            pipe.add(None, literal=ids, done_bytes=len(piece), progress=progress)
    else:
        for piece in pieces:
            pipe.add(piece, add_special=False, done_bytes=len(piece), progress=progress)
    pipe.add(None, literal=tok.suffix, progress=progress)


def _tokenize_prepared(text: bytes, tok, piece_bytes: int) -> np.ndarray:
    pipe = _Pipeline(tok, 1)
    _add_text(pipe, text, len(text), tok, piece_bytes, None)
    return pipe.finish(None)


def tokenize_text(data: bytes, tok, escape: bool = True, name: str = "<text>", piece_bytes: int = 0) -> np.ndarray:
    """Tokenize one text (a file's bytes) exactly as llama.cpp's ``-f FILE`` does.

    ``piece_bytes > 0`` allows piecewise tokenization (see the module docstring); the
    default, 0, makes one tokenizer call, the same as llama.cpp's."""
    piece_bytes = check_int("piece_bytes", piece_bytes, 0)
    text = prepare_text(data, escape, name, check=tok.rejects_above_max_codepoint)
    return _tokenize_prepared(text, tok, piece_bytes)


def default_jobs() -> int:
    """Tokenizer workers by default: one less than the usable CPUs. On two (often
    hyper-threaded) vCPUs that means none: two workers there were slower than one process
    (8 MB with SmolLM2: 4.1 s in-process, 7.1 s with two workers on a busy machine)."""
    return max(1, usable_cpus() - 1)


def tokenize_files(paths: Iterable[str | os.PathLike], tok, escape: bool = True, jobs: int | None = None,
                   progress=None, piece_bytes: int | None = None) -> np.ndarray:
    """Tokenize files (or directories, see :func:`expand_inputs`) as llama.cpp tokenizes each
    ``-f FILE``, and concatenate their tokens in order.

    ``jobs``: worker processes for long texts (default: one less than the CPUs this process
    may use, since this process feeds them; 1 = tokenize in this process, no workers).
    Workers are started with ``spawn``, which re-imports the main module: a script that
    calls this with ``jobs > 1`` needs the usual ``if __name__ == "__main__":`` guard. They
    start only for GGUF tokenizers and at least 1 MiB of text (below that, starting them
    costs more than it saves); a Hugging Face tokenizer runs pieces in its own threads
    instead.
    ``piece_bytes``: piece size for piecewise tokenization (default 64 KiB; 0 = one call per
    file, exactly llama.cpp's result; see the module docstring for how pieces can differ).
    ``progress``: an object with ``update(n_bytes)`` (e.g. :class:`ngramcache.progress.Progress`
    with ``unit="B"``), called as input bytes are done.
    """
    jobs = check_int("jobs", jobs, 1, none_ok=True)
    piece_bytes = check_int("piece_bytes", piece_bytes, 0, none_ok=True)
    files, _ = expand_inputs(paths)
    if jobs is None:
        jobs = default_jobs()
    if piece_bytes is None:
        piece_bytes = DEFAULT_PIECE_BYTES
    total = sum(f.stat().st_size for f in files)
    parallel = (jobs > 1 and total >= PARALLEL_MIN_BYTES and isinstance(tok, GGUFTokenizer)
                and (piece_bytes > 0 or len(files) > 1))
    pipe = _Pipeline(tok, jobs if parallel else 1)
    try:
        # Files and their pieces go through one ordered stream, so many small files are
        # spread over the workers as well as the pieces of one long file.
        for f in files:
            data = read_input(f)
            text = prepare_text(data, escape, str(f), check=tok.rejects_above_max_codepoint)
            _add_text(pipe, text, len(data), tok, piece_bytes, progress)
            del data
        return pipe.finish(progress)
    finally:
        pipe.close()


