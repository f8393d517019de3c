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


def test_the_any_copy_ceiling_proposes_the_longest_copyable_prefix_of_the_answer():
    prompt = [5, 6, 7, 8, 9, 1, 2]
    truth = np.array([7, 8, 9, 4, 7], dtype=np.int32)  # 7 8 9 stand in the prompt, 7 8 9 4 does not
    d = gate_sim.AnyCopyCeiling(truth, len(prompt), COSTS, n_draft=8)
    d.reset(prompt)
    assert d.propose(8).tolist() == [7, 8, 9]
    assert d.propose(2).tolist() == [7, 8]
    d.accept([7, 8, 9])
    assert d.propose(8).size == 0  # 4 was never seen: no copy holds it
    d.accept([4])
    assert d.propose(8).tolist() == [7]


def test_nothing_is_proposed_where_the_copy_does_not_pay():
    steep = [1.0, 2.5, 3.5]  # one drafted token costs more than the two tokens it can give
    d = gate_sim.AnyCopyCeiling(np.array([3, 9], dtype=np.int32), 2, steep, n_draft=8)
    d.reset([3, 3])
    assert d.propose(8).size == 0
