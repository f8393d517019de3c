"""The command line, `python -m ngramcache COMMAND`: one module per command, one error path
(``main``)."""

from ngramcache.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
