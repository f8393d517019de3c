"""`python -m ngramcache <command>`: the everyday commands (demo, generate, serve, chat)
and tools that mirror llama.cpp's lookup tools.

Each command is a module of ``ngramcache.cli`` with ``add_parser(subparsers)``; its
``run(args)`` returns the exit status or raises, and :func:`main` turns every exception
into the exit status and one line on stderr, the same way for all commands.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap

from ngramcache.cli._common import InputError, RunError, UsageError

# The order of `ngramcache --help`: the everyday commands, then the tools.
COMMANDS = ("demo", "generate", "serve", "chat", "create", "merge", "convert", "info", "stats", "check-exact")
EVERYDAY = ("demo", "generate", "serve", "chat")

DESCRIPTION = "Draft-free speculative decoding with llama.cpp-compatible n-gram caches."
EPILOG = """\
'ngramcache COMMAND --help' describes a command, docs/cli.md all of them.
exit status: 0 ok, 1 a failure (one line on stderr says what), 2 bad arguments
or an unusable input, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."""
# The commands that write a file: a signal stops them cleanly and truthfully (cli/_stop.py).
WRITERS = ("create", "merge", "convert")


def build_parser() -> argparse.ArgumentParser:
    from ngramcache import __version__

    parser = argparse.ArgumentParser(prog="ngramcache", usage="%(prog)s [-h] [-V] COMMAND ...", epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-V", "--version", action="version", version=f"ngramcache {__version__}")
    # The command list is printed by the description below, grouped, one line a command.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS, prog="ngramcache")
    for name in COMMANDS:
        importlib.import_module(f"ngramcache.cli.{name.replace('-', '_')}").add_parser(sub)
    parser.description = DESCRIPTION + "\n\n" + _command_list(sub.choices)
    return parser


def _command_list(parsers: dict, columns: int = 80) -> str:
    def block(title, names):
        width = max(map(len, names))
        lines = [title]
        for n in names:
            # One line a command; a summary too long for that still keeps within the columns.
            lines += textwrap.wrap(parsers[n].get_default("summary"), columns, initial_indent=f"  {n:<{width}}  ",
                                   subsequent_indent=" " * (width + 4))
        return "\n".join(lines)

    rest = [n for n in parsers if n not in EVERYDAY]
    return block("everyday commands:", [n for n in EVERYDAY if n in parsers]) + "\n\n" + block("tools:", rest)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from ngramcache.cli import _stop

    if args.command in WRITERS:
        _stop.install()
    try:
        return int(args.run(args) or 0)
    except InputError as e:
        # The flags were fine: their usage would only bury the one line that matters.
        status = _fail(args, str(e), 2)
        print(f"try 'ngramcache {args.command} --help'", file=sys.stderr)
        return status
    except UsageError as e:
        args._parser.print_usage(sys.stderr)
        return _fail(args, str(e), 2)
    except _stop.Terminated:
        print(f"ngramcache {args.command}: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"ngramcache {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _drop_stdout()  # the reader left (e.g. `| head`): nothing more to tell anyone
        return 1
    except MemoryError:
        return _fail(args, "out of memory")
    except OSError as e:
        return _fail(args, _describe_oserror(e))
    except (RunError, ValueError, ImportError, RuntimeError) as e:
        return _fail(args, _damaged(e) + str(e))
    except OverflowError as e:  # counts summed past lookup.bin's int32 (merge)
        return _fail(args, str(e))


def _fail(args, message: str, status: int = 1) -> int:
    print(f"ngramcache {args.command}: error: {message}", file=sys.stderr)
    return status


def _describe_oserror(e: OSError) -> str:
    # The OS names the file in e.filename; our own messages already name it.
    if e.filename is not None and e.strerror:
        return e.strerror if str(e.filename) in e.strerror else f"{e.filename}: {e.strerror}"
    fallback = "no such file or directory" if isinstance(e, FileNotFoundError) else e.strerror or "I/O error"
    return str(e) or fallback


def _damaged(e: Exception) -> str:
    from ngramcache import CacheFormatError
    from ngramcache._state_file import StateFileError

    # Messages that already say what failed to load need no more: a state file's (its name,
    # its kind, what is wrong) and stats' llama.cpp wording ("failed to open ...").
    if isinstance(e, StateFileError) or not isinstance(e, CacheFormatError) or str(e).startswith("failed to open"):
        return ""
    return "damaged or not a cache file: "


def _drop_stdout() -> None:
    # Point stdout at /dev/null so that the interpreter's final flush does not fail again.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        sys.stdout = open(os.devnull, "w")
