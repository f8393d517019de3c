"""create on Dask workers, sorted runs and their streaming merge: ``ngramcache.corpus.sharded``, under the name earlier releases gave it."""

import sys

import ngramcache.corpus.sharded as _module

sys.modules[__name__] = _module
