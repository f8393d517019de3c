"""Decoding: the speculative loop over any model backend, the gate that sizes each draft,
and the text a loop emits."""
