import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _vectors() -> Path | None:
    env = os.environ.get("NGRAMCACHE_VECTORS")
    for cand in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "vectors", ROOT / "vectors"]:
        if (cand / "prose.tokens.i32").is_file():
            return cand
    return None


VECTORS = _vectors()


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    """The llama.cpp reference vectors (../shared/vectors, or $NGRAMCACHE_VECTORS)."""
    if VECTORS is None:
        pytest.skip("reference vectors not found (set NGRAMCACHE_VECTORS)")
    return VECTORS
