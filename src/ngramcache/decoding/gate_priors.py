"""What the drafting gate believes before it has seen a state: how often drafted tokens were
right, per state and draft position, on a varied set of prompts (code edits, summaries,
quotes from a document, chat turns, open text) and two models, SmolLM2-135M and Gemma 3 270M,
greedy. Fitted by ``bench/gate_sim.py states --write`` (docs/gate.md);
the benchmarks' own workloads were kept out of the fit.

``TABLE[(source, length bucket, previous outcome)]`` holds the chance that drafted token j is
right given that the ones before it were, for j in the position buckets 0, 1, 2-3, 4-7, 8-15
and 16 on. Source: 0 lookup caches, 1 a copy of an earlier span, 2 a suffix match's most
frequent continuation. Length bucket (the match or proposal length): 1, 2-3, 4-7, 8+.
Previous outcome: 0 the previous proposal's first token was wrong, 1 right, 2 no proposal.
"""

from __future__ import annotations

POSITION_BUCKETS = ((0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 1 << 30))

TABLE: dict[tuple[int, int, int], tuple[float, ...]] = {
    (0, 0, 0): (0.739, 0.848, 0.855, 0.733, 0.919, 0.96),
    (0, 0, 1): (0.925, 0.922, 0.942, 0.96, 0.971, 0.986),
    (0, 0, 2): (0.648, 0.709, 0.775, 0.833, 0.924, 0.973),
    (0, 1, 0): (0.742, 0.848, 0.855, 0.733, 0.919, 0.96),
    (0, 1, 1): (0.925, 0.922, 0.942, 0.96, 0.971, 0.986),
    (0, 1, 2): (0.648, 0.709, 0.775, 0.833, 0.924, 0.973),
    (0, 2, 0): (0.742, 0.848, 0.855, 0.733, 0.919, 0.96),
    (0, 2, 1): (0.925, 0.943, 0.942, 0.962, 0.971, 0.986),
    (0, 2, 2): (0.648, 0.709, 0.814, 0.833, 0.924, 0.973),
    (0, 3, 0): (0.742, 0.848, 0.855, 0.932, 0.919, 0.96),
    (0, 3, 1): (0.925, 0.943, 0.953, 0.962, 0.973, 0.987),
    (0, 3, 2): (0.648, 0.709, 0.814, 0.921, 0.924, 0.973),
    (1, 0, 0): (0.596, 0.626, 0.857, 0.926, 0.867, 0.975),
    (1, 0, 1): (0.697, 0.581, 0.797, 0.882, 0.912, 0.95),
    (1, 0, 2): (0.589, 0.658, 0.842, 0.877, 0.902, 0.953),
    (1, 1, 0): (0.596, 0.626, 0.857, 0.926, 0.867, 0.975),
    (1, 1, 1): (0.697, 0.581, 0.797, 0.882, 0.912, 0.95),
    (1, 1, 2): (0.589, 0.658, 0.842, 0.877, 0.902, 0.953),
    (1, 2, 0): (0.786, 0.626, 0.903, 0.926, 0.982, 0.978),
    (1, 2, 1): (0.809, 0.862, 0.901, 0.911, 0.924, 0.972),
    (1, 2, 2): (0.816, 0.94, 0.945, 0.987, 0.902, 0.984),
    (1, 3, 0): (0.786, 0.985, 0.989, 0.946, 0.997, 0.998),
    (1, 3, 1): (0.975, 0.978, 0.979, 0.985, 0.991, 0.993),
    (1, 3, 2): (0.816, 0.982, 0.986, 0.992, 0.997, 0.998),
    (2, 0, 0): (0.41, 0.662, 0.547, 0.9, 0.82, 0.993),
    (2, 0, 1): (0.387, 0.668, 0.662, 0.897, 0.888, 0.977),
    (2, 0, 2): (0.355, 0.582, 0.767, 0.95, 0.902, 0.965),
    (2, 1, 0): (0.501, 0.662, 0.829, 0.9, 0.82, 0.993),
    (2, 1, 1): (0.635, 0.68, 0.814, 0.897, 0.888, 0.977),
    (2, 1, 2): (0.377, 0.629, 0.881, 0.95, 0.902, 0.965),
    (2, 2, 0): (0.762, 0.662, 0.913, 0.908, 0.983, 0.993),
    (2, 2, 1): (0.812, 0.856, 0.898, 0.915, 0.924, 0.977),
    (2, 2, 2): (0.816, 0.938, 0.944, 0.987, 0.902, 0.965),
    (2, 3, 0): (0.907, 0.985, 0.989, 0.946, 0.997, 0.999),
    (2, 3, 1): (0.975, 0.977, 0.978, 0.985, 0.992, 0.994),
    (2, 3, 2): (0.816, 0.982, 0.985, 0.992, 0.997, 0.998),
}

#: for a state the table lacks: the flat prior of a gate without priors
FALLBACK = 1.0 / 3.0


def prior_means(n_positions: int) -> list[list[float]]:
    """Prior means per gate state (``AdaptiveGate.state``'s numbering) for positions
    0 .. ``n_positions - 1``."""
    from ngramcache.decoding.gate import AdaptiveGate

    n_len = len(AdaptiveGate._LEN_BUCKETS)
    out = []
    for src in range(AdaptiveGate.N_SOURCES):
        for b in range(n_len):
            for prev in range(3):
                row = TABLE.get((src, b, prev))
                means = []
                for j in range(n_positions):
                    pb = next(i for i, (lo, hi) in enumerate(POSITION_BUCKETS) if lo <= j < hi)
                    means.append(row[pb] if row is not None else FALLBACK)
                out.append(means)
    return out
