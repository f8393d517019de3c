"""`python -m ngramcache <command>`: mirrors llama.cpp's lookup tools.

Each command lives in its own module under ``ngramcache.commands`` exposing
``add_parser(subparsers)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module under ngramcache.commands
COMMANDS = {
    "create": "create", "merge": "merge", "convert": "convert", "info": "info",
    "stats": "stats",
    "generate": "generate", "demo": "demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ngramcache",
        description="Draft-free speculative decoding with llama.cpp-compatible n-gram caches.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(f"ngramcache.commands.{modname}")
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
