"""Decoding: the speculative loop over any model backend, the gate that sizes each draft
(its policy, its learnt cost curve and its priors), and the text a loop emits."""
