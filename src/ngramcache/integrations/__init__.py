"""Model runtimes as verifiers: llama-cpp-python (``llama``) and transformers (``hf``)."""
