"""Hugging Face transformers as the verifier: ``ngramcache.integrations.hf``, under the name earlier releases gave it."""

import sys

import ngramcache.integrations.hf as _module

sys.modules[__name__] = _module
