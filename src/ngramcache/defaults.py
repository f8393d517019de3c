"""The defaults and bounds of draft lengths, each declared once.

``n_draft`` is the most tokens a drafter proposes in one step. Its default differs by what
drafts, on purpose, and each bound has its own reason; the command line, the server,
``ngramcache.integrations.hf``, ``stats`` (``ngramcache.replays``) and the drafters read
them from here. The compiled core declares the replay's bound and its drafters' option
defaults itself (``_core.limits()``, ``_core.defaults()``); the tests check that they equal
the package's declarations (this module's and each drafter's ``OPTIONS``).
"""

from __future__ import annotations

__all__ = ["N_DRAFT", "HF_N_DRAFT", "PROMPT_LOOKUP_N_DRAFT", "STATS_N_DRAFT", "MAX_DECODE_DRAFT", "MAX_REPLAY_DRAFT",
           "MAX_DRAFT"]

#: tokens per step unless told otherwise: every drafter, ``make_drafter``, ``generate``,
#: ``demo``, ``chat`` and ``serve``. Draft lengths adapt (only what is expected to pay is
#: verified), so the bound can be generous.
N_DRAFT = 16

#: ``ngramcache.integrations.hf``'s default: transformers on a CPU verifies 33 tokens for about
#: three times the cost of one, so longer drafts pay there (docs/hf.md).
HF_N_DRAFT = 32

#: ``PromptLookupDrafter``'s default, made alone: Hugging Face's ``prompt_lookup_num_tokens``, so
#: that its proposals are the peers' (by name, ``pld`` takes ``N_DRAFT`` as every drafter does).
PROMPT_LOOKUP_N_DRAFT = 10

#: ``stats``' default: llama-lookup-stats' and llama.cpp's ``--spec-draft-n-max`` (3 since
#: 2026-05-19), so that its figures compare with llama.cpp's.
STATS_N_DRAFT = 3

#: the most tokens decoding with a model drafts per step: ``--spec-draft-n-max`` of
#: ``generate``, ``demo``, ``chat`` and ``serve``, and a request's ``speculative.n_draft``
#: (a draft is verified in one batch).
MAX_DECODE_DRAFT = 256

#: the most tokens a replay (``stats``, ``ngramcache.replay``, ``replay_drafter``) drafts per
#: step: its figures have one row per draft position (the core's bound, ``_core.limits()``).
MAX_REPLAY_DRAFT = 1 << 16

#: the most tokens any drafter, and ``ngramcache.draft``, may be asked for: the output is
#: reserved up front, so an absurd ``n_draft`` is a mistake to report, not memory to reserve.
MAX_DRAFT = 1 << 20
