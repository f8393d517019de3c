"""The one reader and writer of ngramcache's small state files: the ngram-mod table
(``NGMT``), the suffix store (``NGSS``) and the server's memory (``NGSRVMEM``).

Each is, little-endian: a magic, a u32 version, the format's own header fields, a payload
whose size those fields fix, and the CRC-32 of every byte before it (docs/format.md). A
:class:`StateFormat` writes one atomically (``ngramcache.files.atomic_open``: an
interrupted save leaves the previous file whole) and reads one back only once the magic,
the version, the size the header promises and the checksum all hold, so that the
format's own loader sees nothing but an intact file. Every refusal is a
:class:`StateFileError` (a ``CacheFormatError``) whose message names the file and says
what is wrong, whole: "damaged or not a ... file (why)", or, for state learned with
other token ids, "made for another vocabulary".
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Callable, Iterable

from ngramcache._core import CacheFormatError

__all__ = ["StateFormat", "StateFileError", "VocabularyMismatchError"]

_VERSION = struct.Struct("<I")
_CRC = struct.Struct("<I")


class StateFileError(CacheFormatError):
    """A state file that cannot be loaded; the message names the file and the problem."""


class VocabularyMismatchError(StateFileError):
    """An intact state file learned with another vocabulary: its token ids would mean
    other text with this model."""


class StateFormat:
    """One state-file format: ``magic`` (bytes), ``version``, ``fields`` (a
    little-endian ``struct`` format of the header after magic and version) and ``what``,
    the file's kind with its article ("an ngram-mod table"), for messages."""

    def __init__(self, magic: bytes, version: int, fields: str, what: str):
        if not fields.startswith("<"):
            raise ValueError("state-file header fields must be little-endian ('<...')")
        self.magic = magic
        self.version = version
        self.fields = struct.Struct(fields)
        self.what = what
        self.header_size = len(magic) + _VERSION.size + self.fields.size

    def damaged(self, name: str, why: str) -> StateFileError:
        """The error for a file of this kind that is damaged (or another kind of file)."""
        return StateFileError(f"{name}: damaged or not {self.what} file ({why})")

    def write(self, path: str | os.PathLike, fields: tuple, parts: Iterable) -> None:
        """Write the header with ``fields``, then each of ``parts`` (bytes-like, e.g.
        little-endian numpy arrays), then the CRC-32, atomically."""
        from ngramcache.files import atomic_open

        header = self.magic + _VERSION.pack(self.version) + self.fields.pack(*fields)
        with atomic_open(path, "wb") as f:
            f.write(header)
            crc = zlib.crc32(header)
            for part in parts:
                view = memoryview(part).cast("B")
                f.write(view)
                crc = zlib.crc32(view, crc)
            f.write(_CRC.pack(crc))

    def read(self, path: str | os.PathLike,
             payload_size: Callable[[tuple], int] | None) -> tuple[tuple, memoryview]:
        """(header fields, payload) of the file at ``path``, once its magic, version,
        size and checksum hold. ``payload_size(fields)`` is the payload's size in bytes
        that the fields promise; None where the header alone does not fix it (the caller
        checks the payload's own lengths). A missing file raises ``FileNotFoundError``."""
        name = os.fspath(path)
        with open(name, "rb") as f:
            data = f.read()
        if len(data) < self.header_size + _CRC.size:
            if not self.magic.startswith(data[: len(self.magic)]):
                raise self.damaged(name, f"{len(data)} bytes, no {self.magic.decode()} magic")
            raise self.damaged(name, f"truncated: {len(data)} bytes")
        magic = data[: len(self.magic)]
        if magic != self.magic:
            raise self.damaged(name, f"magic {magic!r}, expected {self.magic!r}")
        (version,) = _VERSION.unpack_from(data, len(self.magic))
        if version != self.version:
            raise StateFileError(f"{name}: {self.what} file of version {version}; this ngramcache reads "
                                 f"version {self.version}")
        fields = self.fields.unpack_from(data, len(self.magic) + _VERSION.size)
        expected = len(data) if payload_size is None else self.header_size + payload_size(fields) + _CRC.size
        if len(data) != expected:
            raise self.damaged(name, f"{len(data)} bytes do not hold the {expected} its header promises: truncated?")
        (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
        if zlib.crc32(memoryview(data)[: -_CRC.size]) != crc:
            raise self.damaged(name, "checksum mismatch")
        return fields, memoryview(data)[self.header_size : -_CRC.size]

    def check_vocabulary(self, name: str, saved: tuple[int, bytes], current: tuple[int, bytes]) -> None:
        """Refuse a file whose (vocabulary size, fingerprint) is not this model's."""
        if tuple(saved) != tuple(current):
            raise VocabularyMismatchError(
                f"{name}: {self.what} made for another vocabulary ({saved[0]} tokens, fingerprint "
                f"{saved[1][:4].hex()}...); this model has {current[0]} tokens (fingerprint "
                f"{current[1][:4].hex()}...): its token ids would mean other text")
