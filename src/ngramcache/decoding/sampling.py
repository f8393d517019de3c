"""Token choice at one position of a generated sequence, from that position's row of logits.

Every sampler first processes the row the same way: divide by ``temperature``, keep the
``top_k`` most likely tokens (0: all), then the smallest set of those holding ``top_p`` of
their probability mass (1: all). ``temperature`` 0 is greedy: the argmax of the raw row.

* :class:`Sampler` draws by inverting the cumulative distribution with the next uniform
  number of one random stream, one number per emitted token.
* :class:`SeededSampler` draws with the Gumbel-max trick from noise that depends only on
  ``(seed, position)``: the token at a position is
  ``argmax_j(processed_logit_j + G_j)`` over the kept tokens ``j``, with ``G_j`` the
  ``j``-th entry of :func:`gumbel_noise(seed, position, n_vocab) <gumbel_noise>`. That is
  an exact sample of the processed distribution (the maximum of log-probabilities plus
  independent standard Gumbel noise falls on token ``j`` with probability ``p_j``), and
  because the noise at a position is fixed before any logits are seen, checking a drafted
  token is a comparison, exactly as in greedy decoding: wherever the model computes the
  same rows batched as one token at a time, the text with drafting is, token for token,
  the text without it, whatever was drafted, rejected or reused from a prompt cache.

:func:`make_sampler` picks the sampler for ``generate``'s arguments: seeded when a seed is
given, otherwise :class:`Sampler`.
"""

from __future__ import annotations

import numpy as np

from ngramcache._validate import check_int

__all__ = ["Sampler", "SeededSampler", "gumbel_noise", "make_sampler"]

_DOUBLE_STEP = 2.0 ** -53


def gumbel_noise(seed: int, position: int, n: int) -> np.ndarray:
    """The standard Gumbel noise of ``(seed, position)`` for token ids ``0 .. n-1``
    (float64).

    Entry ``j`` comes from the ``j``-th 64-bit output ``r_j`` of numpy's PCG64 generator
    seeded with ``numpy.random.SeedSequence([seed, position])``:
    ``u_j = (floor(r_j / 2**11) + 0.5) / 2**53`` (strictly inside (0, 1)) and
    ``G_j = -log(-log(u_j))``. Only PCG64's raw outputs and SeedSequence's seeding are
    used, not a ``Generator`` method (whose streams numpy may change between releases for
    speed or accuracy); the conversion to noise is done here. Entry ``j`` does not depend
    on ``n``."""
    seed, position, n = check_int("seed", seed, 0), check_int("position", position, 0), check_int("n", n, 0)
    return _gumbel(_raw(seed, position, n))


def _raw(seed: int, position: int, n: int) -> np.ndarray:
    return np.random.PCG64(np.random.SeedSequence([seed, position])).random_raw(n)


def _gumbel(raw: np.ndarray) -> np.ndarray:
    u = ((raw >> np.uint64(11)).astype(np.float64) + 0.5) * _DOUBLE_STEP
    return -np.log(-np.log(u))


def _top_p_order(x: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest set of ``x`` holding ``top_p`` of the mass of
    ``exp(x)``, in decreasing ``x`` with ties in index order.

    Sorting a whole vocabulary costs far more than the draw, and the kept set is usually a
    few dozen tokens: the candidates are every entry at least the m-th largest (ties
    included, so they are exactly the first entries of the full sorted order), m growing
    until they hold enough mass."""
    e = np.exp(x)
    target = top_p * float(e.sum())
    m = 64
    while True:
        if m < x.size:
            cand = np.flatnonzero(x >= np.partition(x, x.size - m)[x.size - m])
        else:
            cand = np.arange(x.size)
        order = cand[np.argsort(-x[cand], kind="stable")]
        c = np.cumsum(e[order])
        if c[-1] >= target or m >= x.size:
            break
        m *= 8
    return order[: min(int(np.searchsorted(c, target)) + 1, order.size)]


class _TokenChoice:
    """The settings shared by the samplers, checked, and the row processing."""

    def __init__(self, temperature: float, top_k: int, top_p: float):
        temperature, top_p = float(temperature), float(top_p)
        if not (temperature >= 0.0) or not np.isfinite(temperature):
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        top_k = check_int("top_k", top_k, 0)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.greedy = temperature == 0.0
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p

    def kept(self, row: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """The tokens a draw may pick and their processed logits (float64, the best 0).

        Returns ``(ids, x)``: ``x[i]`` belongs to token ``ids[i]``, or to token ``i``
        when ``ids`` is None (no truncation). With ``top_p`` < 1 the kept tokens come in
        decreasing probability (ties in id order)."""
        if self.top_k and self.top_k < row.size:
            ids = np.sort(np.argpartition(row, -self.top_k)[-self.top_k:])
            x = row[ids].astype(np.float64)
        else:
            ids = None
            x = row.astype(np.float64)
        x = (x - x.max()) / self.temperature
        if self.top_p < 1.0:
            order = _top_p_order(x, self.top_p)
            ids = order if ids is None else ids[order]
            x = x[order]
        return ids, x


class Sampler(_TokenChoice):
    """Token choice at one position: argmax (``temperature`` 0), or a draw from the
    processed distribution (module docstring) by inverting its cumulative distribution
    with the next number of one random stream (``seed``: numpy's ``default_rng(seed)``).

    One uniform number is used per emitted token, so a seed gives the same text whatever
    was drafted as long as tokens are chosen in order, once each. ``generate`` uses
    :class:`SeededSampler` when given a seed, whose draws depend on the position alone."""

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None):
        super().__init__(temperature, top_k, top_p)
        self.rng = np.random.default_rng(check_int("seed", seed, 0, none_ok=True))

    def __call__(self, row: np.ndarray, position: int | None = None) -> int:
        """The token chosen from one row of logits (``position`` is not used)."""
        if self.greedy:
            return int(np.argmax(row))
        u = self.rng.random()
        ids, x = self.kept(row)
        c = np.cumsum(np.exp(x))
        j = min(int(np.searchsorted(c, u * c[-1], side="right")), c.size - 1)
        return int(ids[j]) if ids is not None else j


class SeededSampler(_TokenChoice):
    """Token choice at one position with noise keyed by ``(seed, position)``: argmax
    (``temperature`` 0), or the Gumbel-max draw of the module docstring.

    ``position`` is the token's index in the whole sequence (the prompt's first token is
    0), so the same seed and prompt give the same text with or without drafting, and
    the draw at a position does not depend on which positions were sampled before."""

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, *, seed: int):
        super().__init__(temperature, top_k, top_p)
        self.seed = check_int("seed", seed, 0)

    def __call__(self, row: np.ndarray, position: int) -> int:
        """The token chosen from one row of logits for the token at ``position``."""
        if self.greedy:
            return int(np.argmax(row))
        position = check_int("position", position, 0)
        ids, x = self.kept(row)
        raw = _raw(self.seed, position, row.size)
        if ids is None:
            return int(np.argmax(x + _gumbel(raw)))
        return int(ids[np.argmax(x + _gumbel(raw[ids]))])

    def __repr__(self) -> str:
        return (f"SeededSampler(temperature={self.temperature}, top_k={self.top_k}, "
                f"top_p={self.top_p}, seed={self.seed})")


def make_sampler(temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None) -> Sampler | SeededSampler:
    """The sampler for these settings: :class:`SeededSampler` when ``seed`` is given,
    :class:`Sampler` (a fresh random stream) otherwise. Both are called as
    ``sampler(row, position)``."""
    if seed is None:
        return Sampler(temperature, top_k, top_p)
    return SeededSampler(temperature, top_k, top_p, seed=seed)
