"""TextSink (token pieces to UTF-8 text, the one decoder of generated text) and
accepted_prefix (the one count of a draft's accepted tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import PROMPT, reference
from ngramcache import CopyDrafter
from ngramcache.decoding.loop import Stream, generate
from ngramcache._prefix import accepted_prefix
from ngramcache.decoding.text_sink import TextSink
from support import FakeModel

EOG = 3


class Pieces:
    """A backend's piece/is_eog: token i is the i-th byte string below; token 3 ends
    generation and has bytes of its own (some tokenizers give the end marker a text)."""

    TABLE = [b"a", "é".encode()[:1], "é".encode()[1:], b"</s>", "€".encode()[:2], "€".encode()[2:], b"\xff"]

    def piece(self, tok):
        return self.TABLE[tok]

    def is_eog(self, tok):
        return tok == EOG


def test_text_is_handed_out_once_its_bytes_are_complete():
    sink = TextSink(Pieces())
    assert sink.feed([0, 1]) == "a"  # the first byte of "é" is held back
    assert sink.feed([2]) == "é"
    assert sink.feed([4]) == ""
    assert sink.feed([5, 0]) == "€a"
    assert sink.flush() == ""


def test_end_of_generation_bytes_are_not_text_and_the_end_is_flushed():
    sink = TextSink(Pieces())
    assert sink.feed([0, EOG]) == "a"
    assert sink.feed([4]) == ""
    assert sink.flush() == "\ufffd"  # an incomplete character at the end
    assert sink.feed([0]) == "a"  # a flushed sink starts a new text
    assert TextSink.text_of(Pieces(), [6, 0, EOG]) == "\ufffda"  # invalid UTF-8


def test_split_parts_join_to_the_whole_text():
    tokens = [0, 1, 2, 4, 5, 0, 6, 1]
    for n in range(len(tokens) + 1):
        sink = TextSink(Pieces())
        drafted, own = sink.split(tokens, n)
        assert drafted == TextSink(Pieces()).feed(tokens[:n])
        assert drafted + own + sink.flush() == TextSink.text_of(Pieces(), tokens)


def test_a_backend_without_pieces_is_refused():
    with pytest.raises(TypeError, match="piece"):
        TextSink(object())


class MultiByteModel(FakeModel):
    """FakeModel whose pieces are parts of multi-byte characters, and whose EOS has text."""

    def piece(self, tok):
        return "αβγ€".encode()[tok % 9 : tok % 9 + 1] if tok != self.eos else b"<eos>"


def test_stream_pieces_equal_the_result_text_and_end_of_generation_adds_none():
    want = reference(PROMPT, 200)
    eos = want[57]
    st = Stream(MultiByteModel(eos=eos), PROMPT, CopyDrafter(n_draft=4), 200)
    pieces = list(st)
    assert st.result.stop_reason == "eos" and st.result.tokens[-1] == eos
    assert "".join(pieces) == st.result.text
    assert st.result.text == TextSink.text_of(MultiByteModel(eos=eos), want[: want.index(eos)])
    assert "<eos>" not in st.result.text


def test_stream_stops_when_on_tokens_says_so():
    seen = []

    def on_tokens(tokens, n_from_draft):
        seen.extend(tokens)
        return len(seen) >= 5

    st = Stream(FakeModel(), PROMPT, CopyDrafter(n_draft=4), 80, on_tokens=on_tokens)
    text = "".join(st)
    assert st.result.stop_reason == "stop" and st.result.tokens.tolist() == seen
    assert text == st.result.text == generate(FakeModel(), PROMPT, None, len(seen)).text


@pytest.mark.parametrize("n", [0, 1, 5, 31, 32, 33, 200])
def test_accepted_prefix_counts_the_leading_equal_tokens(n):
    rng = np.random.default_rng(n)
    a = rng.integers(0, 5, size=n).astype(np.int32)
    for cut in range(0, n + 1, max(1, n // 7)):
        b = a.copy()
        if cut < n:
            b[cut] += 1
        assert accepted_prefix(a, b) == cut
        assert accepted_prefix(a.tolist(), b) == cut  # lists and arrays alike
        assert accepted_prefix(a, b[: cut // 2]) == cut // 2  # only the shorter length is compared
    assert accepted_prefix(a, []) == 0
