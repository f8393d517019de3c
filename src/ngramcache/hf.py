"""Hugging Face transformers as the verifier (``pip install ngramcache[hf]``): the public names
of ``ngramcache.integrations.hf``, where they are defined and documented, under a short name."""

from ngramcache.integrations.hf import (GATE_SETTINGS, MIN_TRANSFORMERS, DrafterCandidateGenerator, Drafting,
                                        adaptive_drafter, calibrate, chat_input_ids, cost_key, generate, load_model,
                                        verify_costs)

__all__ = ["DrafterCandidateGenerator", "Drafting", "generate", "load_model", "chat_input_ids", "calibrate",
           "verify_costs", "cost_key", "adaptive_drafter", "GATE_SETTINGS", "MIN_TRANSFORMERS"]
