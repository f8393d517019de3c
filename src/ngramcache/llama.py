"""llama-cpp-python as the verifier: ``ngramcache.integrations.llama``, under the name earlier releases gave it."""

import sys

import ngramcache.integrations.llama as _module

sys.modules[__name__] = _module
