"""Every drafter by name, as the command line and the benchmarks choose them: a view of
``ngramcache.drafters.registry``, where each drafter is declared.

``make_drafter("suffix", n_draft=16)`` builds the drafter called ``suffix``
with its own defaults for every option not given; ``DRAFTERS`` maps each name to a one-line
description (registered drafters included). Names follow llama.cpp's ``--spec-type`` where
llama.cpp has the drafter (``ngram-simple`` is ``simple`` here, ``ngram-map-k`` is ``map-k``,
``ngram-mod`` is ``mod``).
"""

from ngramcache.drafters.registry import DEFAULT_DRAFTER, DRAFTERS, drafter_class, make_drafter

__all__ = ["DRAFTERS", "DEFAULT_DRAFTER", "make_drafter", "drafter_class"]
