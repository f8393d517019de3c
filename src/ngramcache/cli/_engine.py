"""The flags ``serve`` and ``chat`` share: the model, its context and threads, what drafts,
and the memory the drafters keep across requests (a chat's turns); and the engine they build."""

from __future__ import annotations

import os

from ngramcache.cli._common import RunError, UsageError, check_output_path, check_ranges
from ngramcache.cli._drafters import add_draft_length_flag, add_drafter_flags, check_draft_length, drafter_options
from ngramcache.cli._inputs import add_model_flag
from ngramcache.defaults import N_DRAFT
from ngramcache.models import DEFAULT_MODEL


# Where serve and chat say it differently: a server's requests may choose their own
# temperature and drafting, a chat's turns cannot.
_WORDING = {
    "serve": {"temp": "temperature when a request gives none", "drafter": "what drafts when a request does not say",
              "no-draft": "plain decoding unless a request asks for a drafter", "memory": "memory across requests",
              "saved": "at shutdown", "earlier": "earlier requests",
              "no-memory": "each request drafts from itself alone (nothing learned across requests)"},
    "chat": {"temp": "temperature", "drafter": "what drafts", "no-draft": "plain decoding, one token per step",
             "memory": "memory across turns", "saved": "at the end of the chat", "earlier": "earlier turns",
             "no-memory": "each turn drafts from the conversation so far alone (nothing learned across /reset)"},
}


def add_engine_flags(p, chat: bool = False) -> None:
    """The engine's flags, worded for ``chat`` (turns) or ``serve`` (requests)."""
    say = _WORDING["chat" if chat else "serve"]
    add_model_flag(p)
    p.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N", help="context size (default: 4096)")
    p.add_argument("-b", "--batch-size", type=int, default=512, metavar="N", help="prompt batch size (default: 512)")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="threads for single tokens and batches alike (default: usable cores, at most 8)")
    p.add_argument("--temp", type=float, default=0.0, metavar="T",
                   help=f"{say['temp']}; 0 = greedy (default: 0)")
    p.add_argument("--chat-template-file", metavar="FNAME",
                   help="a Jinja2 chat template to use instead of the one in the model's GGUF")
    from ngramcache.drafters.catalog import DEFAULT_DRAFTER

    add_drafter_flags(p, DEFAULT_DRAFTER, say["drafter"])
    g = p.add_argument_group("drafting")
    add_draft_length_flag(p, g, N_DRAFT, "; with adaptive drafting only what pays is verified",
                          aliases=("--draft-max",))
    g.add_argument("--no-draft", action="store_true", help=say["no-draft"])
    g.add_argument("--fixed-draft", action="store_true",
                   help="always draft up to --spec-draft-n-max tokens (no adaptive draft lengths)")
    m = p.add_argument_group(say["memory"])
    m.add_argument("--memory", metavar="FNAME",
                   help="keep what the drafters learn in this file: loaded at start if it exists, saved "
                        f"atomically every --memory-save-interval minutes and {say['saved']}")
    m.add_argument("--memory-save-interval", type=float, default=5.0, metavar="MIN",
                   help="minutes between saves of --memory (default: 5)")
    m.add_argument("--memory-tokens", type=int, default=1_000_000, metavar="N",
                   help=f"tokens of {say['earlier']} remembered, oldest forgotten first (default: 1000000)")
    m.add_argument("--no-memory", action="store_true",
                   help=say["no-memory"])


def _check_memory_path(path: str) -> None:
    """--memory is read at start and saved while serving: anything that would make the
    read hang (a pipe) or every save fail (a link to nowhere) stops the start."""
    from ngramcache.files import check_regular_file

    if os.path.islink(path) and not os.path.exists(path):
        raise RunError(f"--memory {path}: a symbolic link to {os.readlink(path)}, which does not exist")
    if os.path.exists(path):
        check_regular_file(path, "memory file")
    check_output_path(path)


def build_engine(args, model_default: str = DEFAULT_MODEL):
    """The engine the flags describe (loads the model: seconds)."""
    import ngramcache.integrations.llama as nl
    from ngramcache.models import model_path
    from ngramcache.serving.engine import ChatTemplate, Engine, Memory

    check_draft_length(args)
    check_ranges(args, [("ctx_size", 64, "-c must be >= 64"),
                        ("batch_size", 1, "-b must be >= 1"), ("threads", 1, "-t must be >= 1"),
                        ("memory_tokens", 1, "--memory-tokens must be >= 1")])
    if not args.temp >= 0:
        raise UsageError(f"--temp must be >= 0, got {args.temp}")
    if not args.memory_save_interval > 0:
        raise UsageError(f"--memory-save-interval must be > 0, got {args.memory_save_interval}")
    if args.memory and args.no_memory:
        raise UsageError("--memory and --no-memory contradict each other")
    if args.memory and not args.no_memory:
        _check_memory_path(args.memory)
    options = drafter_options(args)
    template = None
    if args.chat_template_file:
        with open(args.chat_template_file, encoding="utf-8") as f:
            template = f.read()
    path = model_path(args.model or model_default)
    llm = nl.make_llama(path, n_ctx=args.ctx_size, n_batch=args.batch_size, n_threads=args.threads)
    backend = nl.LlamaBackend.of(llm)
    memory = None
    if not args.no_memory:
        if args.memory and os.path.exists(args.memory):
            from ngramcache.serving.engine import vocab_fingerprint

            memory = Memory.load(args.memory, backend.n_vocab, vocab_fingerprint(backend),
                                 max_tokens=args.memory_tokens)
        else:
            memory = Memory(max_tokens=args.memory_tokens)
    name = os.path.basename(args.model) if args.model and os.path.isfile(args.model) else (args.model or model_default)
    chat = ChatTemplate.of(llm, template)
    try:
        engine = Engine(llm, model_name=name, drafter=None if args.no_draft else args.drafter,
                        n_draft=args.n_draft, drafter_options=options, adaptive=not args.fixed_draft,
                        memory=memory, memory_path=args.memory if memory is not None else None,
                        save_every=60.0 * args.memory_save_interval, chat_template=chat)
    except (ValueError, TypeError) as e:
        raise UsageError(f"--drafter {args.drafter}: {e}") from None
    engine.temperature = args.temp
    if engine.drafter is not None:  # a bad drafter option fails now, not at the first request
        try:
            engine.make_drafter(engine.drafter, max(1, engine.n_draft))
        except (ValueError, TypeError) as e:
            engine.close()
            raise UsageError(f"--drafter {args.drafter}: {e}") from None
    return engine
