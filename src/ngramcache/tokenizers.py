"""Tokenizers: ``ngramcache.corpus.tokenizers``, under the name earlier releases gave it."""

import sys

import ngramcache.corpus.tokenizers as _module

sys.modules[__name__] = _module
