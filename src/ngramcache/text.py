"""llama.cpp's text rules for -f and -p: ``ngramcache.corpus.text``, under the name earlier releases gave it."""

import sys

import ngramcache.corpus.text as _module

sys.modules[__name__] = _module
