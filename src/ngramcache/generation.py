"""The speculative loop over any model backend: ``ngramcache.decoding.loop``, under the name earlier releases gave it."""

import sys

import ngramcache.decoding.loop as _module

sys.modules[__name__] = _module
