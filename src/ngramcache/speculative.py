"""llama.cpp's own n-gram drafters: ``ngramcache.drafters.llama_ngram``, under the name earlier releases gave it."""

import sys

import ngramcache.drafters.llama_ngram as _module

sys.modules[__name__] = _module
