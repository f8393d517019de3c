"""The compact copy of the reference vectors in tests/data (scripts/compact_vectors.py makes it).

It holds the files its manifest (compact.json) lists: whole files exactly as recorded, and of
each draft log the rows the manifest's rule keeps, tie positions included. Where the full
set is present too, the copy is current: every file and every kept row is the full set's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import COMPACT_COPY, COMPACT_MANIFEST, full_vector_set, read_vector_bytes

MANIFEST = json.loads((COMPACT_COPY / COMPACT_MANIFEST).read_text())
FILES = MANIFEST["files"]
LOGS = sorted(name for name, entry in FILES.items() if "rows_kept" in entry)
WHOLE = sorted(name for name in FILES if name not in LOGS)


def stored(name: str) -> bytes:
    """The file as the copy stores it, gunzipped where the copy added the .gz."""
    entry = FILES[name]
    path = COMPACT_COPY / entry["stored"]
    return read_vector_bytes(path) if entry["stored"] == name + ".gz" else path.read_bytes()


def kept_lines(name: str) -> list[bytes]:
    return read_vector_bytes(COMPACT_COPY / FILES[name]["stored"]).splitlines(keepends=True)


def positions(lines: list[bytes]) -> list[int]:
    return [json.loads(line)["pos"] for line in lines]


@pytest.fixture(scope="module")
def full_set() -> Path:
    d = full_vector_set()
    if d is None:
        pytest.skip("the full set of reference vectors is not here to compare the compact copy with")
    return d


def test_every_stored_file_is_listed():
    on_disk = {str(p.relative_to(COMPACT_COPY)) for p in COMPACT_COPY.rglob("*") if p.is_file()}
    listed = {entry["stored"] for entry in FILES.values()}
    assert on_disk - listed == {COMPACT_MANIFEST, "README.md"}
    assert listed <= on_disk


@pytest.mark.parametrize("name", WHOLE)
def test_whole_file_is_the_recorded_one(name):
    data = stored(name)
    assert (len(data), hashlib.sha256(data).hexdigest()) == (FILES[name]["bytes"], FILES[name]["sha256"])


@pytest.mark.parametrize("name", LOGS)
def test_log_keeps_the_first_rows_and_every_tie_position(name):
    entry = FILES[name]
    pos = positions(kept_lines(name))
    assert len(pos) == entry["rows_kept"]
    assert pos == sorted(set(pos)) and pos[-1] <= entry["rows"]
    assert pos[:600] == list(range(1, 601))
    ties = name.replace(".jsonl", ".ties.jsonl")
    if ties in FILES:
        assert set(positions(stored(ties).splitlines())) <= set(pos)


@pytest.mark.parametrize("name", WHOLE)
def test_whole_file_is_current(full_set, name):
    assert stored(name) == (full_set / name).read_bytes()


@pytest.mark.parametrize("name", LOGS)
def test_log_rows_are_current(full_set, name):
    entry = FILES[name]
    raw = (full_set / name).read_bytes()
    full = read_vector_bytes(full_set / name)
    assert (len(raw), hashlib.sha256(raw).hexdigest()) == (entry["bytes"], entry["sha256"])
    assert hashlib.sha256(full).hexdigest() == entry["rows_sha256"]
    full_lines = full.splitlines(keepends=True)
    assert len(full_lines) == entry["rows"]
    for line in kept_lines(name):
        pos = json.loads(line)["pos"]
        assert line == full_lines[pos - 1], f"{name} at pos {pos}"
