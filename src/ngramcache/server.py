"""The OpenAI-compatible HTTP application: ``ngramcache.serving.app``, under the name earlier releases gave it."""

import sys

import ngramcache.serving.app as _module

sys.modules[__name__] = _module
