"""`ngramcache serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn)."""

from __future__ import annotations

import errno
import logging
import os
import socket
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
A second SIGTERM or Ctrl-C exits at once (status 143 or 130; the memory is not saved).
Anyone who can reach the port may use the server unless it has a key (--api-key-file,
--api-key or NGRAMCACHE_API_KEY); see "Security" in docs/serve.md.
See docs/serve.md for every endpoint, field and flag, and the memory file.

examples:
  python -m ngramcache serve -m smollm2 --port 8080
  python -m ngramcache serve -m model.gguf --memory memory.bin --drafter suffix
  python -m ngramcache serve -m smollm2 -lcs corpus.ngst
  NGRAMCACHE_API_KEY=secret python -m ngramcache serve --host 0.0.0.0 --allowed-host box.lan
"""

PREFIX = "ngramcache serve: "
#: where serve reads its API key when no flag gives one
KEY_ENV = "NGRAMCACHE_API_KEY"


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
    s = p.add_argument_group("security (docs/serve.md, \"Security\")")
    s.add_argument("--api-key-file", metavar="FNAME",
                   help="every route but /health and the page needs 'Authorization: Bearer KEY', KEY being this "
                        "file's first line")
    s.add_argument("--api-key", metavar="KEY",
                   help=f"the key itself (seen by anyone who lists processes: prefer --api-key-file or "
                        f"{KEY_ENV}); default: ${KEY_ENV} when set")
    s.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                   help="a Host name the server answers to (repeatable; '*' = any); others get 421 "
                        "(default: the --host address, localhost, 127.0.0.1 and ::1; any for 0.0.0.0 or ::)")
    s.add_argument("--openapi-docs", action="store_true",
                   help="serve FastAPI's /docs, /redoc and /openapi.json (off by default)")
    lim = p.add_argument_group("limits (docs/serve.md, \"Limits\")")
    lim.add_argument("--max-connections", type=int, default=1024, metavar="N",
                     help="open connections at most: at the bound the one that has waited longest for a request "
                          "is closed, or, all being busy, the new one is answered 503 (default: 1024)")
    lim.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                     help="seconds a connection may take to send a request's head once opened or answered; "
                          "then it is closed (default: 10)")
    lim.add_argument("--body-timeout", type=float, default=60.0, metavar="S",
                     help="seconds a request's body may take to arrive whole; then it is answered 408 "
                          "(default: 60)")


def _check(args) -> None:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_body_bytes < 1:
        raise UsageError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if args.max_queue is not None and args.max_queue < 1:
        raise UsageError(f"--max-queue must be >= 1, got {args.max_queue}")
    if not 0 <= args.shutdown_timeout <= 3600:
        raise UsageError(f"--shutdown-timeout must be in [0, 3600] seconds, got {args.shutdown_timeout}")
    if args.max_connections < 1:
        raise UsageError(f"--max-connections must be >= 1, got {args.max_connections}")
    for flag in ("header_timeout", "body_timeout"):
        if not 0 < getattr(args, flag) <= 3600:
            raise UsageError(f"--{flag.replace('_', '-')} must be in (0, 3600] seconds, got {getattr(args, flag)}")
    if args.api_key is not None and args.api_key_file is not None:
        raise UsageError("give the key once: --api-key or --api-key-file, not both")
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


def _api_key(args) -> str | None:
    """The key from --api-key-file, --api-key or the environment (None: none)."""
    from ngramcache.files import check_regular_file

    source, key = None, None
    if args.api_key_file is not None:
        check_regular_file(args.api_key_file, "key file")
        with open(args.api_key_file, encoding="utf-8") as f:
            key = f.readline().strip()
        source = args.api_key_file
    elif args.api_key is not None:
        key, source = args.api_key.strip(), "--api-key"
    elif os.environ.get(KEY_ENV) is not None:
        key, source = os.environ[KEY_ENV].strip(), KEY_ENV
    if source is None:
        return None
    if not key:
        raise UsageError(f"{source}: the API key is empty")
    if not key.isprintable() or not key.isascii() or " " in key:
        raise UsageError(f"{source}: the API key must be printable ASCII without spaces")
    return key


def _allowed_hosts(args):
    from ngramcache.serving.guards import default_allowed_hosts

    if args.allowed_host is None:
        return default_allowed_hosts(args.host)
    if "*" in args.allowed_host:
        return None
    return tuple(h.strip("[]").lower() for h in args.allowed_host)


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads: a port in use is one line now,
    not a failure after a minute of loading."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise RunError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        where = f"{host}:{port}"
        if e.errno == errno.EADDRINUSE:
            raise RunError(f"{where}: the address is already in use (another server? choose another --port)") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise RunError(f"{where}: --host is not an address of this machine") from None
        if e.errno == errno.EACCES:
            raise RunError(f"{where}: not permitted to listen there (ports below 1024 need privileges)") from None
        raise RunError(f"{where}: cannot listen: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def _warn(message: str) -> None:
    print(f"{PREFIX}warning: {message}", file=sys.stderr, flush=True)


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
        from ngramcache.serving.connections import (FILES_PER_SERVER, guarded_protocol, quiet_accept_errors,
                                                    raise_open_files_limit)
        from ngramcache.serving.guards import is_loopback
    except ImportError:
        raise ImportError("serve needs its extra: pip install 'ngramcache[serve]'") from None
    key = _api_key(args)
    allowed = _allowed_hosts(args)
    if key is None and not is_loopback(args.host):
        _warn(f"listening on {args.host} without an API key: anyone who can reach this port can generate text, "
              f"read /metrics and write into the memory (give --api-key-file; docs/serve.md, \"Security\")")
    limit = raise_open_files_limit(args.max_connections + FILES_PER_SERVER)
    max_connections = min(args.max_connections, max(1, limit - FILES_PER_SERVER))
    if max_connections < args.max_connections:
        _warn(f"--max-connections {args.max_connections} lowered to {max_connections}: this process may open "
              f"{limit} files (ulimit -n)")
    listener = _listen(args.host, args.port)
    static = _static_table(args.lookup_cache_static) if args.lookup_cache_static else None
    _log_to_stderr()
    try:
        engine = build_engine(args)
    except StateFileError as e:  # its message says whole what is wrong with --memory's file
        listener.close()
        raise RunError(str(e)) from None
    except BaseException:
        listener.close()
        raise
    engine.static = static
    engine.max_queue = args.max_queue
    engine.max_token_bytes  # the prompt length bound, worked out once before any request
    stopped = None
    try:
        app = create_app(engine, aliases=tuple(args.alias), close_engine=True,
                         shutdown_timeout=args.shutdown_timeout, max_body_bytes=args.max_body_bytes,
                         api_key=key, allowed_hosts=allowed, openapi_docs=args.openapi_docs,
                         body_timeout=args.body_timeout)

        class Server(uvicorn.Server):
            async def startup(self, sockets=None):
                import asyncio

                quiet_accept_errors(asyncio.get_running_loop(), logging.getLogger("ngramcache.serving"))
                await super().startup(sockets=sockets)
                for s in self.servers:  # where it listens, once bound (port 0 picks one)
                    for sock in s.sockets:
                        host, port = sock.getsockname()[:2]
                        print(f"{PREFIX}{engine.model_name} on http://{host}:{port}", file=sys.stderr, flush=True)

            def handle_exit(self, sig, frame):
                if self.should_exit:  # the second signal: no more waiting
                    print(f"{PREFIX}second signal: exiting now"
                          + (" (the memory is not saved)" if engine.memory_path is not None else ""),
                          file=sys.stderr, flush=True)
                    os._exit(128 + int(sig))
                super().handle_exit(sig, frame)

            async def shutdown(self, sockets=None):
                nonlocal stopped
                for s in self.servers:  # no new connections while the engine drains
                    s.close()
                # before uvicorn closes the connections: the stopped requests get their answers
                stopped = await app.state.drain()
                await super().shutdown(sockets=sockets)
                # uvicorn ends the process by re-raising the signal after this: the last word is here
                _report_memory(engine, stopped)

        # uvicorn's own bound (a plain-text 503) is only a backstop: it also counts the
        # connections closed a moment ago to make room, which ours does not
        config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=5,
                                limit_concurrency=2 * max_connections)
        config.load()
        config.http_protocol_class = guarded_protocol(config.http_protocol_class, max_connections=max_connections,
                                                      header_timeout=args.header_timeout)
        Server(config).run(sockets=[listener])
    finally:
        listener.close()
        if stopped is None:  # the server did not get as far as its shutdown
            _report_memory(engine, engine.close(args.shutdown_timeout, max(10.0, args.shutdown_timeout)))
    return 0

