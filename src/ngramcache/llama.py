"""llama-cpp-python as the verifier (``pip install ngramcache[llama]``): the public names of
``ngramcache.integrations.llama``, where they are defined and documented, under a short name."""

from ngramcache.integrations.llama import (CountingDraftModel, ExactnessReport, LlamaBackend, LlamaDrafter,
                                           adaptive_drafter, calibrate, check_exact, check_llama, cost_store_path,
                                           default_threads, exactness_status, generate, generate_llama_cpp,
                                           learned_costs, load_costs, make_llama, no_weight_repacking, store_costs,
                                           stream, verify_costs)

__all__ = [
    "LlamaDrafter", "generate", "stream", "make_llama", "check_llama", "default_threads",
    "verify_costs", "learned_costs", "calibrate", "adaptive_drafter", "load_costs", "store_costs", "cost_store_path",
    "LlamaBackend", "CountingDraftModel", "generate_llama_cpp",
    "check_exact", "exactness_status", "ExactnessReport", "no_weight_repacking",
]
