"""llama.cpp's text rules: what its tools do to a ``-f FILE`` (and to a prompt) before tokenizing.

llama.cpp (``common_params_parse`` + ``common_tokenize``) does four things with ``-f FILE``:

1. reads the whole file as bytes;
2. drops ONE trailing ``\\n`` if the file ends with one;
3. processes escape sequences (``--escape`` is on by default): ``\\n \\r \\t \\' \\" \\\\``
   and ``\\xHH`` become the byte they name; any other backslash pair stays as it is.
   (``\\xHH`` follows ``strtol``: the two characters after ``x`` must parse completely
   as a base-16 number, so ``\\x 5``, ``\\x+5`` and ``\\x-1`` are escapes too);
4. tokenizes with ``add_special=True, parse_special=True``: the model's BOS (and EOS, if
   its GGUF says so) is added and special-token text such as ``<|im_start|>`` becomes the
   special token.

:func:`prepare_text` does steps 2 and 3 (and the check below); :func:`read_text_file`
reads a file and applies them; :func:`prompt_text` applies step 3 to a ``-p`` prompt, as
llama.cpp does. :func:`split_pieces` cuts long texts where no tokenizer of the
regex-splitting kind can have a token across the cut (see ``ngramcache.corpus.tokenizers``).

Invalid text: if the text (after escapes) holds a 4-byte UTF-8 sequence whose code point
lies above U+10FFFF, llama.cpp's BPE tokenizers (SmolLM2's, and other non-SentencePiece
vocabularies) throw an exception that nothing catches and the process aborts. For those
tokenizers such text is rejected here first, with an :class:`InvalidTextError` naming the
file and the byte offset. SentencePiece vocabularies (Gemma's) tokenize it like any other
bytes. Other invalid UTF-8 is accepted (llama.cpp replaces each bad byte with U+FFFD).
"""
from __future__ import annotations

import os
import re

__all__ = ["InvalidTextError", "process_escapes", "check_codepoints", "prepare_text", "read_input", "read_text_file",
           "prompt_text", "split_pieces", "DEFAULT_PIECE_BYTES"]

DEFAULT_PIECE_BYTES = 64 * 1024


class InvalidTextError(ValueError):
    """Text that llama.cpp's tokenizer would reject (it aborts the process on it)."""

    def __init__(self, message: str, path: str, offset: int):
        super().__init__(message)
        self.path = path
        self.offset = offset


# ----------------------------------------------------------------------------------------
# Escape processing (llama.cpp's string_process_escapes)
# ----------------------------------------------------------------------------------------

# strtol(x, &end, 16) on the two characters after "\x" must consume both: two hex digits,
# or C-locale whitespace or a sign followed by one hex digit.
_ESCAPE_RE = re.compile(rb"\\(?:([nrt'\"\\])|x([0-9A-Fa-f]{2}|[ \t\n\v\f\r+\-][0-9A-Fa-f]))")
_SIMPLE = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"'": b"'", b'"': b'"', b"\\": b"\\"}


def _escape_value(m: re.Match) -> bytes:
    simple = m.group(1)
    if simple is not None:
        return _SIMPLE[simple]
    # int() accepts the same leading whitespace and sign as strtol; a negative value
    # wraps as char(val) does in C.
    return bytes((int(m.group(2), 16) & 0xFF,))


def process_escapes(data: bytes) -> bytes:
    """llama.cpp's escape processing of a prompt (``--escape``, on by default)."""
    if b"\\" not in data:
        return data
    return _ESCAPE_RE.sub(_escape_value, data)


def _source_offset(data: bytes, out_offset: int) -> tuple[int, bool]:
    """Map a byte offset in ``process_escapes(data)`` back to ``data``.

    Returns (offset in data, whether that output byte came from an escape sequence)."""
    removed = 0
    for m in _ESCAPE_RE.finditer(data):
        out_start = m.start() - removed
        if out_offset < out_start:
            break
        if out_offset == out_start:
            return m.start(), True
        removed += len(m.group(0)) - 1
    return out_offset + removed, False


# ----------------------------------------------------------------------------------------
# Invalid code points
# ----------------------------------------------------------------------------------------

# A 4-byte lead with three continuation bytes whose code point exceeds U+10FFFF: F4 9x-Bx,
# or F5-F7. Such a lead is never a continuation byte, so llama.cpp's decoder (which skips
# one byte after an invalid sequence) always starts a character there: a plain search
# finds exactly the sequences it would reject.
_ABOVE_MAX_RE = re.compile(rb"(?:\xF4[\x90-\xBF]|[\xF5-\xF7][\x80-\xBF])[\x80-\xBF]{2}")


def check_codepoints(text: bytes, name: str = "<text>", source: bytes | None = None) -> None:
    """Raise InvalidTextError if ``text`` has a UTF-8 sequence decoding above U+10FFFF.

    ``source`` is the file's content before escape processing, when ``text`` came from it:
    the error then gives the offset in the file."""
    m = _ABOVE_MAX_RE.search(text)
    if m is None:
        return
    seq = m.group(0)
    cp = ((seq[0] & 0x07) << 18) | ((seq[1] & 0x3F) << 12) | ((seq[2] & 0x3F) << 6) | (seq[3] & 0x3F)
    offset, from_escape = m.start(), False
    if source is not None:
        offset, from_escape = _source_offset(source, m.start())
    how = " (produced by an escape sequence there; --no-escape keeps escapes as text)" if from_escape else ""
    raise InvalidTextError(
        f"{name}: byte offset {offset}: the UTF-8 sequence {seq.hex(' ').upper()} encodes U+{cp:X}, "
        f"above U+10FFFF{how}; llama.cpp's tokenizer rejects such text (it aborts), so it cannot be "
        f"tokenized as llama.cpp would", name, offset)


def prepare_text(data: bytes, escape: bool = True, name: str = "<text>", check: bool = True) -> bytes:
    """Steps 2-3 of llama.cpp's ``-f`` handling, then (``check``) the invalid-code-point check."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name}: expected bytes, got {type(data).__name__} (read files in binary mode)")
    data = bytes(data)
    if data.endswith(b"\n"):
        data = data[:-1]
    text = process_escapes(data) if escape else data
    if check:
        check_codepoints(text, name, source=data)
    return text


# ----------------------------------------------------------------------------------------
# Splitting into pieces
# ----------------------------------------------------------------------------------------

_WHITESPACE = frozenset(b" \t\n\v\f\r")


def _is_cut(text: bytes, i: int) -> bool:
    # A lone newline between two non-space bytes: a regex pre-tokenizer ends a pre-token
    # after such a newline whether or not the text goes on. After a run of whitespace it
    # would not: GPT-2's "\s+(?!\S)" splits "\n\n\nclass" as "\n\n", "\n" but keeps a
    # final "\n\n\n" whole.
    return i >= 2 and text[i - 1] == 0x0A and text[i - 2] not in _WHITESPACE and text[i] not in _WHITESPACE


def split_pieces(text: bytes, piece_bytes: int = DEFAULT_PIECE_BYTES) -> list[bytes]:
    """Cut ``text`` right after newlines that start an unindented line, into pieces of at
    most ``piece_bytes`` where such a point exists (a longer stretch without one becomes
    one longer piece). ``piece_bytes <= 0`` or a short text gives ``[text]``."""
    n = len(text)
    if piece_bytes <= 0 or n <= piece_bytes:
        return [text]
    pieces = []
    start = 0
    while n - start > piece_bytes:
        limit = start + piece_bytes
        cut = -1
        # Latest acceptable point within the limit...
        j = text.rfind(b"\n", start, limit)
        while j >= start:
            if j + 1 > start and _is_cut(text, j + 1):
                cut = j + 1
                break
            j = text.rfind(b"\n", start, j)
        if cut <= start:
            # ...else the first one after it.
            j = text.find(b"\n", limit)
            while j != -1 and j + 1 < n and not _is_cut(text, j + 1):
                j = text.find(b"\n", j + 1)
            if j == -1 or j + 1 >= n:
                break
            cut = j + 1
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def read_input(path: str | os.PathLike, limit: int = -1) -> bytes:
    """A file's bytes (its first ``limit`` bytes when ``limit >= 0``); an OSError always
    names the file (a failed read, as of ``/proc/self/mem`` or a bad disk sector, otherwise
    says only "Input/output error")."""
    from ngramcache.files import check_regular_file

    path = os.fspath(path)
    check_regular_file(path)  # a pipe would hang the read, a device never end it
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise type(e)(e.errno, e.strerror, path) from None


def read_text_file(path: str | os.PathLike, escape: bool = True, check: bool = True) -> bytes:
    """A text file's bytes after llama.cpp's ``-f`` rules (:func:`prepare_text`)."""
    path = os.fspath(path)
    return prepare_text(read_input(path), escape, path, check=check)


def prompt_text(prompt: str | bytes, escape: bool = True) -> bytes:
    """A ``-p`` prompt as llama.cpp's tools see it: UTF-8, escapes processed unless
    ``escape`` is False (no trailing-newline rule: that one is for files)."""
    data = prompt.encode("utf-8") if isinstance(prompt, str) else bytes(prompt)
    return process_escapes(data) if escape else data
