"""`ngramcache chat`: a terminal chat that keeps the conversation and its KV cache."""

from __future__ import annotations

import json
import sys

from ngramcache.cli._common import UsageError, command_parser
from ngramcache.cli._engine import add_engine_flags, build_engine

HELP = "chat with a model in the terminal, with speculative decoding"
DESCRIPTION = ("A multi-turn chat: each turn reuses the KV cache of the conversation so far (only the new "
               "tokens are decoded) and drafts with the chosen drafter; tok/s and acceptance per turn.")
EPILOG = """\
Type a message and press Enter; 'q', 'quit', 'exit' or end of input (Ctrl-D) ends the chat,
'/reset' starts a new conversation. When stdin is not a terminal, each line is one turn:
  printf 'Write a Python class Stack.\\nAdd a peek method; give the full code.\\nq\\n' | \\
      python -m ngramcache chat -m smollm2
The per-turn figures go to stderr (--json: one JSON object per turn on stdout instead).
"""

_QUIT = {"q", "quit", "exit", "/quit", "/exit"}


def add_parser(sub) -> None:
    p = command_parser(sub, "chat", run, help=HELP, description=DESCRIPTION, epilog=EPILOG)
    add_engine_flags(p)
    g = p.add_argument_group("chat")
    g.add_argument("--system", metavar="TEXT", help="a system message at the start of the conversation")
    g.add_argument("-n", "--max-tokens", type=int, default=1024, metavar="N",
                   help="most tokens per answer (default: 1024, and never past the context)")
    g.add_argument("--json", action="store_true", help="one JSON object per turn on stdout, no streamed text")


def _turns(stream):
    interactive = stream.isatty()
    while True:
        if interactive:
            try:
                line = input("> ")
            except EOFError:
                return
        else:
            line = stream.readline()
            if not line:
                return
        line = line.rstrip("\r\n")
        if line.strip():
            yield line


def run(args) -> int:
    from ngramcache.serving.engine import Job

    if args.max_tokens < 1:
        raise UsageError(f"-n must be >= 1, got {args.max_tokens}")
    engine = build_engine(args)
    try:
        if engine.chat_template is None:
            raise UsageError("this model has no chat template in its GGUF; give one with --chat-template-file")
        system = [{"role": "system", "content": args.system}] if args.system else []
        messages = list(system)
        out = sys.stdout
        turn = 0
        for line in _turns(sys.stdin):
            if line.strip().lower() in _QUIT:
                break
            if line.strip() == "/reset":
                messages = list(system)
                turn = 0
                print("(new conversation)", file=sys.stderr)
                continue
            turn += 1
            messages.append({"role": "user", "content": line})
            prompt = engine.tokenize(engine.chat_template.render(messages))
            room = engine.n_ctx - int(prompt.size)
            if room < 2:
                print("the conversation fills the context: /reset to start a new one", file=sys.stderr)
                messages.pop()
                turn -= 1
                continue

            def show(text, drafted):
                if not args.json:
                    out.write(text)
                    out.flush()

            job = Job(prompt=prompt, max_tokens=min(args.max_tokens, room - 1), temperature=engine.temperature,
                      on_text=show)
            try:
                r = engine.run(job)
            except KeyboardInterrupt:
                job.cancel()
                job.done.wait()
                r = job.result
                if r is None:
                    raise
            messages.append({"role": "assistant", "content": r.text})
            f = r.figures()
            if args.json:
                out.write(json.dumps({"turn": turn, "text": r.text, "tokens": r.n_tokens,
                                      "prompt_tokens": r.n_prompt, "finish_reason": r.finish_reason, **f}) + "\n")
                out.flush()
            else:
                out.write("\n")
                out.flush()
                tps = f"{f['tokens_per_s']:.1f} tok/s" if f["tokens_per_s"] else "-"
                acc = (f"acceptance {100 * r.acceptance:.0f}% ({r.accepted}/{r.drafted})" if r.drafted
                       else "nothing drafted")
                print(f"[turn {turn}: {r.n_tokens} tokens, {tps}, {acc}, prompt {r.n_prompt} tokens "
                      f"({r.n_cached} cached), drafter {r.drafter or 'none'}]", file=sys.stderr, flush=True)
    finally:
        engine.close()
    return 0
