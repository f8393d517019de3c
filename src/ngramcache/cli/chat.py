"""`ngramcache chat`: a terminal chat that keeps the conversation and its KV cache."""

from __future__ import annotations

import json
import os
import sys

from ngramcache.cli._common import InputError, UsageError, add_output_flags, command_parser
from ngramcache.cli._engine import add_engine_flags, build_engine

HELP = "chat with a model in the terminal, with speculative decoding"
DESCRIPTION = ("A multi-turn chat: each turn reuses the KV cache of the conversation so far (only the new "
               "tokens are decoded) and drafts with the chosen drafter; tokens, tok/s and drafted/accepted "
               "tokens per turn.")
EPILOG = """\
Type a message and press Enter. Lines that start with '/' are commands, answered here and
never sent to the model:
  /help    the commands
  /reset   forget the conversation and start a new one
  /quit    end the chat (so do 'exit', 'q' and end of input, Ctrl-D)
Start a line with '//' to send a message that begins with '/'.

In a terminal that shows colour, the text that came from accepted drafts is blue (not when
stdout is a pipe or a file, nor when NO_COLOR is set). A banner (model, drafter, commands)
and each turn's figures go to stderr; -q leaves them out, --json prints one JSON object per
turn on stdout instead of the streamed text.

When stdin is not a terminal, each line is one turn; a line that is not UTF-8 is skipped,
with a note naming it, and the chat goes on:
  printf 'Write a Python class Stack.\\nAdd a peek method; give the full code.\\nq\\n' | \\
      python -m ngramcache chat -m smollm2
"""

COMMANDS = (("/help", "the commands"), ("/reset", "forget the conversation and start a new one"),
            ("/quit", "end the chat (so do 'exit', 'q' and Ctrl-D)"))
_QUIT = {"q", "quit", "exit", "/quit", "/exit"}
_DRAFTED, _PLAIN = "\x1b[34m", "\x1b[0m"  # blue, as generate --color


def add_parser(sub) -> None:
    p = command_parser(sub, "chat", run, help=HELP, description=DESCRIPTION, epilog=EPILOG)
    add_engine_flags(p, chat=True)
    g = p.add_argument_group("chat")
    g.add_argument("--system", metavar="TEXT", help="a system message at the start of the conversation")
    g.add_argument("-n", "--max-tokens", type=int, default=1024, metavar="N",
                   help="most tokens per answer (default: 1024, and never past the context)")
    g.add_argument("--seed", type=int, metavar="S",
                   help="with --temp > 0: each position's draw depends only on (S, position), so the answers "
                        "are the same with or without drafting, and on every run")
    add_output_flags(p, json_help="print each turn (its text and figures) as one JSON object a line on stdout, "
                                  "instead of the streamed text")


def use_colour(stream) -> bool:
    """Colour for a terminal that shows it: not for a pipe or a file, nor with NO_COLOR set
    (to anything but the empty string) or TERM=dumb."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


# -- input ----------------------------------------------------------------------------------

def _not_utf8(line_no: int, raw: bytes, at: int) -> str:
    return f"line {line_no} is not valid UTF-8 (byte 0x{raw[at]:02X} at offset {at}): skipped"


def _decoded(line_no: int, line, warn) -> str | None:
    """The line as text, or None (reported) when it is not UTF-8. A text stream with
    errors='surrogateescape' (the C locale) hands bad bytes over as lone surrogates."""
    if isinstance(line, bytes):
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError as e:
            warn(_not_utf8(line_no, line, e.start))
            return None
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = line.encode("utf-8", "surrogateescape")
        warn(_not_utf8(line_no, raw, len(line[:e.start].encode("utf-8", "surrogateescape"))))
        return None
    return line


def read_lines(stdin, warn):
    """(line number, text) for each line of ``stdin``, its line ending removed: from a
    terminal through input() (line editing), else as bytes decoded here, so that a line
    that is not UTF-8 is reported through ``warn`` and skipped instead of ending the chat."""
    if stdin.isatty():
        yield from _terminal_lines(warn)
        return
    source = getattr(stdin, "buffer", stdin)
    for n, line in enumerate(iter(source.readline, b"" if source is not stdin else ""), 1):
        text = _decoded(n, line, warn)
        if text is not None:
            yield n, text.rstrip("\r\n")


def _terminal_lines(warn):
    n = 0
    while True:
        n += 1
        try:
            line = input("> ")
        except EOFError:  # Ctrl-D: the shell's prompt goes on a line of its own
            print()
            return
        except UnicodeDecodeError as e:
            warn(_not_utf8(n, e.object, e.start))
            continue
        text = _decoded(n, line, warn)
        if text is not None:
            yield n, text


# -- the chat -------------------------------------------------------------------------------

class Chat:
    """One conversation with the engine: its messages, the turns' figures, what it prints."""

    def __init__(self, engine, args, out=None, err=None):
        self.engine, self.args = engine, args
        self.out = sys.stdout if out is None else out
        self.err = sys.stderr if err is None else err
        self.colour = not args.json and use_colour(self.out)
        self.system = [{"role": "system", "content": args.system}] if args.system else []
        self.messages = list(self.system)
        self.turn = 0

    def say(self, msg: str) -> None:
        """What the chat itself says (always shown: answers to commands, problems)."""
        print(msg, file=self.err, flush=True)

    def note(self, msg: str) -> None:
        """What -q leaves out: the banner, the figures."""
        if not self.args.quiet:
            self.say(msg)

    def banner(self) -> None:
        e = self.engine
        drafter = (f"{e.drafter}, up to {e.n_draft} tokens a step" if e.drafter else "none (plain decoding)")
        colour = "; drafted text in blue" if self.colour else ""
        self.note(f"ngramcache chat: model {e.model_name}, drafter {drafter}{colour}\n"
                  f"commands: {', '.join(name for name, _ in COMMANDS)} (/help explains them)")

    def command(self, text: str) -> bool:
        """Answer a /command here; False when the chat ends."""
        name = text.split()[0].lower()
        if name in _QUIT:
            return False
        if name == "/help":
            width = max(len(n) for n, _ in COMMANDS)
            self.say("\n".join(f"  {n:<{width}}  {what}" for n, what in COMMANDS)
                     + "\n  start a line with // to send a message that begins with /")
        elif name == "/reset":
            self.messages = list(self.system)
            self.turn = 0
            self.say("(the conversation is forgotten: a new one starts)")
        else:
            self.say(f"unknown command {name}: /help lists the commands (a line that starts with // is sent "
                     f"to the model without its first /)")
        return True

    def send(self, text: str) -> None:
        from ngramcache.serving.engine import Job

        engine = self.engine
        self.messages.append({"role": "user", "content": text})
        prompt = engine.tokenize(engine.chat_template.render(self.messages))
        room = engine.n_ctx - int(prompt.size)
        if room < 2:
            self.messages.pop()
            self.say("the conversation fills the context: /reset to start a new one")
            return
        self.turn += 1
        job = Job(prompt=prompt, max_tokens=min(self.args.max_tokens, room - 1), temperature=engine.temperature,
                  seed=self.args.seed, on_text=None if self.args.json else self._show)
        try:
            r = engine.run(job)
        except KeyboardInterrupt:  # stops the answer, not the chat
            job.cancel()
            job.done.wait()
            r = job.result
            if r is None:
                raise
        self.messages.append({"role": "assistant", "content": r.text})
        self._report(r)

    def _show(self, text: str, drafted: bool) -> None:
        self.out.write(f"{_DRAFTED}{text}{_PLAIN}" if drafted and self.colour else text)
        self.out.flush()

    def _report(self, r) -> None:
        f = r.figures()
        if self.args.json:
            self.out.write(json.dumps({"turn": self.turn, "text": r.text, "tokens": r.n_tokens,
                                       "prompt_tokens": r.n_prompt, "finish_reason": r.finish_reason, **f}) + "\n")
            self.out.flush()
            return
        self.out.write("\n")
        self.out.flush()
        tps = f"{f['tokens_per_s']:.1f} tok/s" if f["tokens_per_s"] else "- tok/s"
        drafts = (f"drafted {r.drafted}, accepted {r.accepted} ({100 * r.acceptance:.0f}%)" if r.drafted
                  else "nothing drafted")
        stopped = "" if r.finish_reason == "stop" else f", stopped: {r.finish_reason}"
        self.note(f"[turn {self.turn}: {r.n_tokens} tokens, {tps}, {drafts}, prompt {r.n_prompt} tokens "
                  f"({r.n_cached} cached), drafter {r.drafter or 'none'}{stopped}]")
        if r.why_no_drafts:
            self.note(f"[{r.why_no_drafts}]")


def run(args) -> int:
    if args.max_tokens < 1:
        raise UsageError(f"-n must be >= 1, got {args.max_tokens}")
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    engine = build_engine(args)
    try:
        if engine.chat_template is None:
            raise InputError("this model has no chat template in its GGUF; give one with --chat-template-file")
        chat = Chat(engine, args)
        chat.banner()
        for _, line in read_lines(sys.stdin, lambda msg: chat.say(f"ngramcache chat: {msg}")):
            text = line.strip()
            if not text:
                continue
            if text.lower() in _QUIT:
                break
            if text.startswith("//"):
                chat.send(text[1:])
            elif text.startswith("/"):
                if not chat.command(text):
                    break
            else:
                chat.send(line)
    finally:
        engine.close()
    return 0
