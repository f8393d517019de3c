#!/usr/bin/env python3
"""Writes tests/data: a compact copy of llama.cpp's public reference vectors, which the tests
use when the full set (../shared/vectors) is not there.

    .venv/bin/python scripts/compact_vectors.py [--source DIR] [--out DIR]
    python3 scripts/compact_vectors.py --unpack DEST     (the compact copy under the full set's
                                                          names, for the C++ vector tests)

Every file is kept whole (gzipped, except the small JSON and README files), except the
per-position draft logs: those keep only some of their rows (ROWS_KEPT below). compact.json
records what each full file was: its size and SHA-256 and, for a draft log, its number of
rows and the SHA-256 of all of them, so a test can still check every position of a replay
against llama.cpp by hashing its own rows. The rows kept are byte-for-byte llama.cpp's lines.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = "compact.json"

# Kept whole and stored as they are: small, and worth reading in a diff.
PLAIN = ["cache-stats.jsonl", "corpora.json", "drafters/prose.drafters.header.json", "drafters/README.md"]
# The vectors' own README, renamed so it does not take the place of tests/data/README.md.
RENAMED = {"README.md": "vectors-README.md"}
# Kept whole, gzipped.
WHOLE = [
    "prose.txt", "dynpub.txt", "small-static.txt",
    "prose.tokens.i32", "dynpub.tokens.i32", "small-static.tokens.i32",
    "static-small.lcs.bin", "prose.context.bin", "dynpub.context.bin", "merged.prose+dynpub.bin",
    # The tie annotations are the most informative rows of all, and small once gzipped.
    "prose.drafts.context-only.ties.jsonl", "prose.drafts.full-pub.ties.jsonl",
]
# Draft logs (one row per position) kept in part, each with the tie file whose positions it
# keeps in full; the drafters' logs are gzipped in the full set already.
LOGS = {
    "prose.drafts.context-only.jsonl": "prose.drafts.context-only.ties.jsonl",
    "prose.drafts.full-pub.jsonl": "prose.drafts.full-pub.ties.jsonl",
}
DRAFTER_LOGS = "drafters/*.jsonl.gz"

# The first positions cover the start of the stream (pos 2 and 3 read before the buffer in
# llama.cpp) and the drafters' begin() at pos 513.
FIRST_ROWS = 600
EVERY_NTH = 10
ROWS_KEPT = (f"positions 1..{FIRST_ROWS}, every {EVERY_NTH}th position, and every position named in the "
             "log's tie file (prose.drafts.*.ties.jsonl)")


def gzipped(data: bytes) -> bytes:
    # mtime=0 and no file name in the header: the same input always gives the same bytes.
    return gzip.compress(data, compresslevel=9, mtime=0)


def plain(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def kept_rows(log: bytes, tie_positions: set[int]) -> list[bytes]:
    """The log's lines (newline included) at the positions ROWS_KEPT names."""
    out = []
    for i, line in enumerate(log.splitlines(keepends=True), start=1):
        assert json.loads(line)["pos"] == i, "a draft log has one row per position, in order"
        if i <= FIRST_ROWS or i % EVERY_NTH == 0 or i in tie_positions:
            out.append(line)
    return out


def write(out: Path, stored: str, data: bytes) -> None:
    (out / stored).parent.mkdir(parents=True, exist_ok=True)
    (out / stored).write_bytes(data)


def compact(source: Path, out: Path) -> dict:
    files = {}

    def whole(name: str, stored: str, data: bytes) -> None:
        raw = (source / name).read_bytes()
        write(out, stored, data)
        files[name] = {"stored": stored, "bytes": len(raw), "sha256": sha256(raw)}

    for name in PLAIN:
        whole(name, name, (source / name).read_bytes())
    for name, stored in RENAMED.items():
        whole(name, stored, (source / name).read_bytes())
    for name in WHOLE:
        whole(name, name + ".gz", gzipped((source / name).read_bytes()))

    logs = {name: ties for name, ties in LOGS.items()}
    logs.update({str(p.relative_to(source)): None for p in sorted(source.glob(DRAFTER_LOGS))})
    for name, ties in logs.items():
        raw = (source / name).read_bytes()
        log = plain(source / name)
        tie_positions = set() if ties is None else {json.loads(line)["pos"] for line in plain(source / ties).splitlines()}
        rows = kept_rows(log, tie_positions)
        stored = name if name.endswith(".gz") else name + ".gz"
        write(out, stored, gzipped(b"".join(rows)))
        files[name] = {"stored": stored, "bytes": len(raw), "sha256": sha256(raw),
                       "rows": log.count(b"\n"), "rows_sha256": sha256(log), "rows_kept": len(rows)}

    manifest = {
        "what": "a compact copy of llama.cpp's public reference vectors; see README.md here",
        "made_by": "scripts/compact_vectors.py",
        "rows_kept": ROWS_KEPT,
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def unpack(compact_dir: Path, dest: Path) -> None:
    manifest = json.loads((compact_dir / "compact.json").read_text())
    for name, entry in manifest["files"].items():
        stored = compact_dir / entry["stored"]
        data = stored.read_bytes()
        if entry["stored"] == name + ".gz":
            data = gzip.decompress(data)
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
    (dest / "compact.json").write_bytes((compact_dir / "compact.json").read_bytes())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=ROOT.parent / "shared" / "vectors",
                    help="the full set of reference vectors (default: ../shared/vectors)")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data", help="where to write (default: tests/data)")
    ap.add_argument("--unpack", type=Path, metavar="DEST",
                    help="instead: write the compact copy in tests/data (or --out) under the full set's file "
                         "names into DEST, gunzipped (draft logs stay gzipped, as in the full set)")
    args = ap.parse_args(argv)
    if args.unpack is not None:
        unpack(args.out, args.unpack)
        return 0
    if not (args.source / "prose.tokens.i32").is_file():
        print(f"{args.source}: not the full set of reference vectors", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = compact(args.source, args.out)
    total = sum((args.out / f["stored"]).stat().st_size for f in manifest["files"].values())
    print(f"{len(manifest['files'])} files, {total:,} bytes in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
