"""transformers and torch, for ``ngramcache.integrations.hf`` and ``hf_costs``: imported
when the extra is installed (both modules import without it), and the check that every
entry point needing them makes first."""

from __future__ import annotations

import re

try:
    import torch
    import transformers
    IMPORT_ERROR: ImportError | None = None
except ImportError as e:  # the modules import without the extra; using them needs it
    torch = transformers = None
    IMPORT_ERROR = e

__all__ = ["MIN_TRANSFORMERS", "IMPORT_ERROR", "need_hf", "version_tuple", "torch", "transformers"]

#: the oldest transformers release ``ngramcache.integrations.hf`` supports (the first whose
#: assisted generation builds its candidate generator inside the decoding loop)
MIN_TRANSFORMERS = (4, 57)


def version_tuple(v: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string such as 4.57.0 or 5.0.0rc1."""
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def need_hf() -> None:
    """An ImportError saying what to install unless transformers (>= ``MIN_TRANSFORMERS``)
    and torch are there."""
    if IMPORT_ERROR is not None:
        raise ImportError(f"ngramcache.integrations.hf needs transformers and torch ({IMPORT_ERROR}); "
                          "install them with pip install 'ngramcache[hf]'") from None
    if version_tuple(transformers.__version__) < MIN_TRANSFORMERS:
        raise ImportError(f"ngramcache.integrations.hf needs transformers >= {'.'.join(map(str, MIN_TRANSFORMERS))}, "
                          f"found {transformers.__version__}: pip install 'ngramcache[hf]'")
