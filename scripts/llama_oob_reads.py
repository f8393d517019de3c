#!/usr/bin/env python3
"""Turns runs of an instrumented llama-lookup-stats into the parity data the tests read:
for each run its flags, the n_drafted and n_accept it printed, and what it read before each
chunk's start (docs/parity.md, "Keys before the start of a chunk").

    python scripts/llama_oob_reads.py OUT.json --text small-static.txt \\
        --run "-c 512 --spec-draft-n-max 3" run1.stderr run1.oob ...

A run's .oob file is what the instrumented get_token() wrote: one line per read before the
sequence, "inp_size draft_size draft_capacity offset value", in the order of the reads.
Every chunk makes the same reads at its 2-token step (the 3-gram key's slot -2, then the
4-gram key's slots -3 and -2), then, if that step drafted a token, slot -2 of the grown draft
vector, then, if the chunk reaches a 3-token step, slot -3. Each chunk becomes one row
(S[-2], S[-1], S[-1] once grown, S[-1] before 3 tokens), the layout of
``ngramcache.replay(..., llama_oob=rows)``; a read that did not happen keeps the usual value.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

USUAL = (0, 33, 33, 0)  # ngramcache's defaults (cpp/include/ngramcache/draft.hpp)


def chunk_rows(oob_path: Path) -> list[list[int]]:
    reads = [tuple(int(x) for x in line.split()) for line in oob_path.read_text().splitlines() if line.strip()]
    rows, i = [], 0
    while i < len(reads):
        head = reads[i : i + 3]
        shape = [(r[0], r[1], r[3]) for r in head]
        if shape != [(2, 1, -2), (2, 1, -3), (2, 1, -2)] or head[0][4] != head[2][4]:
            raise ValueError(f"{oob_path}: read {i + 1} does not start a chunk's 2-token step: {head}")
        row = [head[1][4], head[0][4], USUAL[2], USUAL[3]]
        i += 3
        if i < len(reads) and reads[i][:2] == (2, 2):
            if reads[i][3] != -2:
                raise ValueError(f"{oob_path}: read {i + 1}: expected slot -2 of the grown vector, got {reads[i]}")
            row[2] = reads[i][4]
            i += 1
        if i < len(reads) and reads[i][0] == 3:
            if reads[i][1] != 1 or reads[i][3] != -3:
                raise ValueError(f"{oob_path}: read {i + 1}: expected slot -3 before 3 tokens, got {reads[i]}")
            row[3] = reads[i][4]
            i += 1
        rows.append(row)
    return rows


def printed(stderr_path: Path) -> dict:
    text = stderr_path.read_text(errors="replace")
    out = {}
    for name in ("n_drafted", "n_accept"):
        m = re.findall(rf"\b{name}\s*=\s*(\d+)", text)
        if not m:
            raise ValueError(f"{stderr_path}: no '{name} = ...' line (is it llama-lookup-stats' output?)")
        out[name] = int(m[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--text", required=True, help="the -f file the runs read (recorded by name)")
    ap.add_argument("--run", nargs=3, action="append", required=True, metavar=("FLAGS", "STDERR", "OOB"))
    args = ap.parse_args(argv)
    runs = []
    for flags, stderr_path, oob_path in args.run:
        runs.append({"flags": flags, **printed(Path(stderr_path)), "oob_reads": chunk_rows(Path(oob_path))})
    doc = {"text": args.text, "layout": "one row per chunk: S[-2], S[-1], S[-1] once grown, S[-1] before 3 tokens",
           "runs": runs}
    # one row per line: readable in a diff, still small
    body = json.dumps(doc, indent=1)
    body = re.sub(r"\[\s+(-?\d+),\s+(-?\d+),\s+(-?\d+),\s+(-?\d+)\s+\]", r"[\1, \2, \3, \4]", body)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(body + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out}: {len(runs)} runs, {sum(len(r['oob_reads']) for r in runs)} chunks", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
