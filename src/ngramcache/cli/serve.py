"""`ngramcache serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn)."""

from __future__ import annotations

import logging
import sys
import time

from ngramcache._state_file import StateFileError
from ngramcache.cli._common import RunError, UsageError, command_parser
from ngramcache.cli._engine import add_engine_flags, build_engine
from ngramcache.drafters import registry

HELP = "an OpenAI-compatible server and chat page with speculative decoding"
DESCRIPTION = ("Serves /v1/completions, /v1/chat/completions (streaming too), /v1/models, /health, "
               "/metrics and a chat page at /, drafting with ngramcache's drafters and learning across "
               "requests. One request decodes at a time; the others wait their turn in order.")
EPILOG = """\
Flags follow llama-server where it has them (-m, -c, -b, -t, --host, --port, --alias,
--spec-draft-n-max/--draft-max, --chat-template-file, -lcs). A request may choose its own drafting:
  "speculative": {"drafter": "suffix", "n_draft": 8}   or   "speculative": {"enabled": false}
SIGTERM or Ctrl-C: queued requests are answered 503, the running one may finish for
--shutdown-timeout seconds (then it is stopped and answered 503), the memory is saved.
See docs/serve.md for every endpoint, field and flag, and the memory file.

examples:
  python -m ngramcache serve -m smollm2 --port 8080
  python -m ngramcache serve -m model.gguf --memory memory.bin --drafter suffix
  python -m ngramcache serve -m smollm2 -lcs corpus.ngst
"""

PREFIX = "ngramcache serve: "


def add_parser(sub) -> None:
    p = command_parser(sub, "serve", run, help=HELP, description=DESCRIPTION, epilog=EPILOG)
    add_engine_flags(p)
    p.add_argument("-lcs", "--lookup-cache-static", metavar="FNAME",
                   help="static cache for the copy and lookup drafters: an ngramcache static table (.ngst, "
                        "checked whole once at start) or a llama.cpp lookup.bin")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    g.add_argument("--port", type=int, default=8080, help="port (default: 8080; 0 = any free port)")
    g.add_argument("-a", "--alias", action="append", default=[], metavar="NAME",
                   help="another name the model answers to (repeatable)")
    g.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024, metavar="N",
                   help="larger request bodies are refused with 413 (default: 16777216 = 16 MiB)")
    g.add_argument("--max-queue", type=int, default=None, metavar="N",
                   help="requests that may wait for the model; more are refused with 503 (default: no bound)")
    g.add_argument("--shutdown-timeout", type=float, default=5.0, metavar="S",
                   help="at SIGTERM, seconds the running request may take to finish before it is stopped "
                        "(default: 5)")
    g.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default: warning)")


def _check(args) -> None:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_body_bytes < 1:
        raise UsageError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if args.max_queue is not None and args.max_queue < 1:
        raise UsageError(f"--max-queue must be >= 1, got {args.max_queue}")
    if not 0 <= args.shutdown_timeout <= 3600:
        raise UsageError(f"--shutdown-timeout must be in [0, 3600] seconds, got {args.shutdown_timeout}")
    if args.lookup_cache_static and (args.no_draft or not _reads_static(args.drafter)):
        readers = " or ".join(s.name for s in registry.specs() if _reads_static(s.name))
        raise UsageError(f"-lcs applies to --drafter {readers}, not {'--no-draft' if args.no_draft else args.drafter}")


def _reads_static(drafter: str) -> bool:
    return any(s.kind == registry.STATIC for s in registry.spec(drafter).shared_state)


def _static_table(path: str):
    """The -lcs table, checked whole now: a table is read by every request, so a damaged
    one stops the server at start rather than misleading drafts later."""
    from ngramcache.files import open_cache
    from ngramcache.static_table import StaticTable

    t0 = time.perf_counter()
    table = open_cache(path)  # a lookup.bin is parsed whole here: that is its check
    if isinstance(table, StaticTable):
        table.verify()
    print(f"{PREFIX}static table {path}: {len(table):,} keys, checked in {time.perf_counter() - t0:.2f} s",
          file=sys.stderr, flush=True)
    return table


def _log_to_stderr() -> None:
    # the engine's own messages (a memory save that failed) go where serve's lines go
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(PREFIX + "%(message)s"))
    log = logging.getLogger("ngramcache.serving")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _report_memory(engine, stopped: bool) -> None:
    # a failed or skipped save was logged by the engine as it happened
    if engine.memory_path is not None and stopped and engine.last_save_error is None and engine.saves:
        print(f"{PREFIX}memory saved to {engine.memory_path} ({engine.memory.n_tokens:,} tokens)",
              file=sys.stderr, flush=True)


def run(args) -> int:
    _check(args)
    try:
        import uvicorn

        from ngramcache.serving.app import create_app
    except ImportError:
        raise ImportError("serve needs its extra: pip install 'ngramcache[serve]'") from None
    static = _static_table(args.lookup_cache_static) if args.lookup_cache_static else None
    _log_to_stderr()
    try:
        engine = build_engine(args)
    except StateFileError as e:  # its message says whole what is wrong with --memory's file
        raise RunError(str(e)) from None
    engine.static = static
    engine.max_queue = args.max_queue
    stopped = None
    try:
        app = create_app(engine, aliases=tuple(args.alias), close_engine=True,
                         shutdown_timeout=args.shutdown_timeout, max_body_bytes=args.max_body_bytes)

        class Server(uvicorn.Server):
            async def startup(self, sockets=None):
                await super().startup(sockets=sockets)
                for s in self.servers:  # where it listens, once bound (port 0 picks one)
                    for sock in s.sockets:
                        host, port = sock.getsockname()[:2]
                        print(f"{PREFIX}{engine.model_name} on http://{host}:{port}", file=sys.stderr, flush=True)

            async def shutdown(self, sockets=None):
                nonlocal stopped
                for s in self.servers:  # no new connections while the engine drains
                    s.close()
                # before uvicorn closes the connections: the stopped requests get their answers
                stopped = await app.state.drain()
                await super().shutdown(sockets=sockets)
                # uvicorn ends the process by re-raising the signal after this: the last word is here
                _report_memory(engine, stopped)

        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                timeout_graceful_shutdown=5)
        Server(config).run()
    finally:
        if stopped is None:  # the server did not get as far as its shutdown
            _report_memory(engine, engine.close(args.shutdown_timeout, max(10.0, args.shutdown_timeout)))
    return 0

