"""`ngramcache serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn)."""

from __future__ import annotations

import sys

from ngramcache.cli._common import UsageError, command_parser
from ngramcache.cli._engine import add_engine_flags, build_engine

HELP = "an OpenAI-compatible server with speculative decoding (needs ngramcache[serve])"
DESCRIPTION = ("Serves /v1/completions, /v1/chat/completions (streaming too), /v1/models, /health, "
               "/metrics and a chat page at /, drafting with ngramcache's drafters and learning across "
               "requests. One request decodes at a time; the others wait their turn in order.")
EPILOG = """\
Flags follow llama-server where it has them (-m, -c, -b, -t, --host, --port, --alias,
--spec-draft-n-max/--draft-max, --chat-template-file). A request may choose its own drafting:
  "speculative": {"drafter": "suffix", "n_draft": 8}   or   "speculative": {"enabled": false}
See docs/serve.md for every endpoint, field and flag, and the memory file.

examples:
  python -m ngramcache serve -m smollm2 --port 8080
  python -m ngramcache serve -m model.gguf --memory memory.bin --drafter suffix
"""


def add_parser(sub) -> None:
    p = command_parser(sub, "serve", run, help=HELP, description=DESCRIPTION, epilog=EPILOG)
    add_engine_flags(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    g.add_argument("--port", type=int, default=8080, help="port (default: 8080; 0 = any free port)")
    g.add_argument("-a", "--alias", action="append", default=[], metavar="NAME",
                   help="another name the model answers to (repeatable)")
    g.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default: warning)")


def run(args) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    try:
        import uvicorn

        from ngramcache.serving.app import create_app
    except ImportError:
        raise ImportError("serve needs its extra: pip install 'ngramcache[serve]'") from None
    engine = build_engine(args)
    try:
        app = create_app(engine, aliases=tuple(args.alias), close_engine=True)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)

        # tell where it listens once the socket is bound (port 0 picks one)
        orig_startup = server.startup

        async def startup(sockets=None):
            await orig_startup(sockets=sockets)
            for s in server.servers:
                for sock in s.sockets:
                    host, port = sock.getsockname()[:2]
                    print(f"ngramcache serve: {engine.model_name} on http://{host}:{port}", file=sys.stderr,
                          flush=True)

        server.startup = startup
        server.run()
    finally:
        engine.close()
        if engine.save_errors:
            print(f"ngramcache serve: memory not saved: {engine.save_errors[-1]}", file=sys.stderr)
    return 0
