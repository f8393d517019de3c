"""How much of a draft the verifier kept: the one comparison every drafter, adapter and
loop makes when it counts accepted tokens or reuses a cached prefix."""

from __future__ import annotations

import numpy as np

__all__ = ["accepted_prefix"]

# below this many tokens a Python loop over lists beats numpy's per-call cost (drafts are
# usually a few tokens; prompt prefixes are thousands)
_SHORT = 32


def accepted_prefix(draft, verified) -> int:
    """How many leading tokens of ``draft`` equal those of ``verified`` (NumPy arrays or
    sequences of ints): the accepted part of a draft compared with the tokens that really
    followed, or the shared prefix of two token sequences. Only the first
    ``min(len(draft), len(verified))`` tokens are compared."""
    m = min(len(draft), len(verified))
    if m <= 0:
        return 0
    if m <= _SHORT:
        a = draft[:m].tolist() if isinstance(draft, np.ndarray) else list(draft[:m])
        b = verified[:m].tolist() if isinstance(verified, np.ndarray) else list(verified[:m])
        k = 0
        while k < m and a[k] == b[k]:
            k += 1
        return k
    diff = np.flatnonzero(np.asarray(draft[:m]) != np.asarray(verified[:m]))
    return int(diff[0]) if diff.size else int(m)
