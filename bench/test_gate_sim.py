"""The gate replay's ceilings, on token streams small enough to check by hand."""

from __future__ import annotations

import numpy as np

import gate_sim

COSTS = [1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4, 2.6]  # cheap batches: any right token pays


def _bytes(tokens) -> bytes:
    return np.asarray(tokens, dtype=np.int32).tobytes()


def test_a_span_occurs_only_at_a_whole_token():
    text = _bytes([0x0100, 0])  # bytes 00 01 00 00 00 00 00 00
    assert gate_sim._occurs(text, _bytes([0]))
    # the bytes of token 1 stand across the two tokens, not as a token of the text
    assert b"\x01\x00\x00\x00" in text and not gate_sim._occurs(text, _bytes([1]))


def test_the_copyable_prefix_is_the_longest_that_stands_in_the_text_seen():
    prompt = [5, 6, 7, 8, 9, 1, 2]
    truth = np.array([7, 8, 9, 4, 7], dtype=np.int32)  # 7 8 9 stand in the prompt, 7 8 9 4 does not
    assert gate_sim.copyable_lengths(prompt, truth, n_draft=8) == [3, 2, 1, 0, 1]
    assert gate_sim.copyable_lengths(prompt, truth, n_draft=2) == [2, 2, 1, 0, 1]  # at most n_draft
    # 4 was never seen before it was written; once written, the 7 after it is a copy again


def test_the_any_copy_ceiling_is_the_best_plan_of_copies():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    truth = np.array([0, 2, 3, 4, 5, 6, 7, 8, 9], dtype=np.int32)  # then a copy of 8 tokens
    speedup, drafted = gate_sim.any_copy_ceiling(prompt, truth, COSTS, n_draft=8)
    # token 0 comes with the prompt; one step drafts 2..9 (7 tokens: the 8th would pass the end)
    assert drafted == 7 and speedup == 8 / COSTS[7]


def test_nothing_is_drafted_where_the_copy_does_not_pay():
    steep = [1.0, 2.5, 3.5]  # one drafted token costs more than the two tokens it can give
    truth = np.array([3, 3, 3, 3], dtype=np.int32)
    assert gate_sim.copyable_lengths([3, 3], truth, n_draft=8)[1] == 3  # copies there are, all right
    assert gate_sim.any_copy_ceiling([3, 3], truth, steep, n_draft=8) == (1.0, 0)


def test_the_gate_is_told_the_modelled_time_of_each_verification():
    class Recorder:
        stats = None

        def __init__(self):
            self.seen = []

        def verified(self, n_tokens, seconds):
            self.seen.append((n_tokens, seconds))

    rec = Recorder()
    exact = gate_sim.ModelledClock(rec, COSTS, noise=0.0)
    exact.verified(3, 1e-6)  # the replay's own microseconds are not what the gate hears
    exact.verified(40, 1e-6)  # beyond the curve: its last cost
    assert rec.seen == [(3, 1.4), (40, 2.6)]
    noisy = gate_sim.ModelledClock(rec, COSTS, noise=0.2, seed=1)
    times = []
    for _ in range(200):
        noisy.verified(5, 0.0)
        times.append(rec.seen[-1][1])
    assert 1.6 < float(np.median(times)) < 2.0 and np.std(np.log(times)) > 0.1
