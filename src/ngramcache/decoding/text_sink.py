"""Generated tokens in, text out: the one place token pieces become UTF-8 text.

A token's piece is a few bytes, not always a whole character (a multi-byte character can
be split across tokens), so text is handed out only once its bytes are complete; whatever
is still incomplete at the end becomes U+FFFD, as does any invalid sequence. An
end-of-generation token ends the text: its own bytes (if its backend gives it any) are
not text.
"""

from __future__ import annotations

import codecs

__all__ = ["TextSink"]


def _never(tok: int) -> bool:
    return False


class TextSink:
    """Turns the tokens a generation settles on into text, piece by piece.

    ``backend``: anything with ``piece(tok) -> bytes`` and, to tell end-of-generation
    tokens, ``is_eog(tok) -> bool`` (a ``ngramcache.decoding.loop.Backend`` has both). ``feed(tokens)`` returns the text those tokens
    complete, ``split(tokens, n_from_draft)`` the same in two parts (what the first
    ``n_from_draft`` tokens complete, then the rest), ``flush()`` the text left at the end.
    Joined, the parts equal :meth:`text_of` the same tokens."""

    def __init__(self, backend):
        piece, is_eog = getattr(backend, "piece", None), getattr(backend, "is_eog", None)
        if not callable(piece):
            raise TypeError(f"backend must have piece(tok) -> bytes, got {type(backend).__name__}")
        self._piece = piece
        self._is_eog = is_eog if callable(is_eog) else _never
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def _bytes(self, tokens) -> bytes:
        piece, is_eog = self._piece, self._is_eog
        return b"".join(piece(t) for t in map(int, tokens) if not is_eog(t))

    def feed(self, tokens) -> str:
        """The text that ``tokens`` (the next generated tokens) complete."""
        return self._decoder.decode(self._bytes(tokens))

    def split(self, tokens, n_from_draft: int) -> tuple[str, str]:
        """(text completed by ``tokens[:n_from_draft]``, text completed by the rest): the
        accepted drafted tokens and the model's own, for showing them apart."""
        return self.feed(tokens[:n_from_draft]), self.feed(tokens[n_from_draft:])

    def flush(self) -> str:
        """The text still held back (an incomplete character becomes U+FFFD); the sink
        can then start a new text."""
        tail = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return tail

    @classmethod
    def text_of(cls, backend, tokens) -> str:
        """All of ``tokens`` as text, exactly as feeding and flushing a sink would give it."""
        sink = cls(backend)
        return sink.feed(tokens) + sink.flush()
