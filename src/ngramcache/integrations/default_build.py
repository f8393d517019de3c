"""The user's baseline: plain decoding on llama-cpp-python as pip builds it by default.

That build (llamafile's kernels, weights repacked, the tiled matmul on) is faster than the exact
build on some quantization types and is what a user had before installing ngramcache, so
``demo`` compares with it too. It cannot live in the same process as the exact build (one
``llama_cpp`` package per process), so it runs in a child process with the build's folder
first on ``PYTHONPATH``. ``bench/build_default_llama.sh`` (in a clone of the repository) makes
the folder; nothing installs it by default.

``ngramcache.integrations.default_build_child`` is the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["default_build_dir", "plain_runs", "HOW_TO_BUILD", "BUILD_ENV"]

#: where the default build is looked for first (a folder holding the ``llama_cpp`` package)
BUILD_ENV = "NGRAMCACHE_DEFAULT_BUILD"
HOW_TO_BUILD = ("bench/build_default_llama.sh in a clone of ngramcache builds llama-cpp-python as pip does by "
                f"default (5-10 minutes) into ~/.cache/ngramcache/llama-default (or ${BUILD_ENV})")


def default_build_dir() -> Path | None:
    """The default build's folder: ``$NGRAMCACHE_DEFAULT_BUILD``, else
    ``~/.cache/ngramcache/llama-default``; None when it holds no ``llama_cpp`` package."""
    env = os.environ.get(BUILD_ENV)
    folder = Path(env) if env else Path.home() / ".cache" / "ngramcache" / "llama-default"
    return folder if (folder / "llama_cpp" / "__init__.py").is_file() else None


def plain_runs(folder: Path, model: str, prompt: bytes, n_tokens: int, threads: int | None, runs: int,
               timeout: float = 900.0) -> list[dict]:
    """Plain greedy decoding of ``prompt`` on the default build in ``folder``, ``runs`` times
    after a warm-up, in a child process: each run's ``tokens``, ``gen_tok_s``, ``e2e_tok_s``
    and ``t_prompt``. RuntimeError with the child's last words when it fails."""
    env = dict(os.environ)
    env.pop("GGML_CPU_TILED_MM", None)  # llama-cpp-python's own defaults, as a user runs them
    env["NGRAMCACHE_EXACT"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "ngramcache.integrations.default_build_child", model, str(n_tokens),
           str(threads or 0), str(runs)]
    try:
        res = subprocess.run(cmd, input=prompt, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"plain decoding on the default build took more than {timeout:.0f} s") from None
    if res.returncode != 0:
        tail = res.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise RuntimeError("plain decoding on the default build failed: " + " / ".join(tail))
    out = json.loads(res.stdout.decode().strip().splitlines()[-1])
    return out["runs"]

