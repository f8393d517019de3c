"""The server keeps each conversation's drafting gate for the request that continues it."""

import numpy as np
import pytest

from ngramcache.decoding.gate import Gate
from ngramcache.serving.conversations import TAIL_SLACK, ConversationGates

COSTS = [1.0, 1.2, 1.4, 1.6, 1.8]
KEY = ("copy", 4, ())


def _toks(*xs):
    return np.asarray(xs, dtype=np.int32)


def test_the_next_turn_finds_its_conversations_gate_and_a_new_one_finds_none():
    store = ConversationGates()
    a, b = Gate(COSTS), Gate(COSTS)
    first = np.arange(100, dtype=np.int32)
    other = np.arange(100, dtype=np.int32) + 1000
    store.keep(first, KEY, a)
    store.keep(other, KEY, b)
    nxt = np.concatenate([first, _toks(7, 8, 9)])
    assert store.find(nxt, KEY) is a
    assert store.find(nxt, KEY) is None  # handed out until kept again
    assert store.find(np.arange(50, 150, dtype=np.int32), KEY) is None
    assert store.find(np.concatenate([other, _toks(1)]), ("suffix", 4, ())) is None  # another drafter
    assert store.find(np.concatenate([other, _toks(1)]), KEY) is b


def test_the_end_of_an_answer_may_be_rendered_differently():
    store = ConversationGates()
    g = Gate(COSTS)
    seen = np.arange(60, dtype=np.int32)
    store.keep(seen, KEY, g)
    changed_tail = seen.copy()
    changed_tail[-TAIL_SLACK:] += 500
    assert store.find(np.concatenate([changed_tail, _toks(3)]), KEY) is g
    store.keep(seen, KEY, g)
    changed_body = seen.copy()
    changed_body[-TAIL_SLACK - 1] += 500
    assert store.find(changed_body, KEY) is None


def test_the_longest_matching_conversation_wins_and_old_ones_are_dropped():
    store = ConversationGates(capacity=2)
    short, long_ = Gate(COSTS), Gate(COSTS)
    base = np.arange(40, dtype=np.int32)
    store.keep(base, KEY, short)
    store.keep(np.concatenate([base, np.arange(40, 80, dtype=np.int32)]), KEY, long_)
    assert store.find(np.arange(90, dtype=np.int32), KEY) is long_
    store.keep(np.arange(90, dtype=np.int32), KEY, long_)
    store.keep(np.arange(5000, 5100, dtype=np.int32), KEY, Gate(COSTS))  # drops the oldest
    assert len(store) == 2
    assert store.find(np.arange(45, dtype=np.int32), KEY) is None


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        ConversationGates(capacity=0)
