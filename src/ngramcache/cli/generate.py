"""`ngramcache generate`: llama-lookup with a real model (llama-cpp-python)."""

from __future__ import annotations

import os
import sys
import time

from ngramcache.cli._common import (InputError, UsageError, add_output_flags, check_output_path, check_ranges,
                                    command_parser, emit)
from ngramcache.cli._drafters import add_draft_length_flag, add_drafter_flags, check_draft_length, drafter_options
from ngramcache.cli._inputs import add_prompt_input, add_threads_flag, read_prompt
from ngramcache.defaults import N_DRAFT

HELP = "generate text with a real model and lookup drafting (llama-lookup)"
DESCRIPTION = ("Speculative decoding with n-gram lookup drafts, verified by a GGUF model through llama-"
               "cpp-python; output identical to the model alone (greedy).")

EPILOG = """\
Like llama.cpp's llama-lookup: prints the prompt and the text as it is generated, then the
summary block on stderr (-q leaves the block out, --no-prompt the prompt). Differences: greedy by default (--temp 0), -n defaults to 128,
and draft lengths adapt to what verification costs on this model and how often drafts are
right (learnt while decoding, nothing measured at start-up, and kept in ~/.cache/ngramcache
for the next command); --fixed-draft always
drafts up to --spec-draft-n-max tokens, as llama-lookup does. --drafter chooses what drafts
(docs/drafters.md); -lcs and -lcd apply to the lookup and copy drafters.

-lcs: opening a .ngst checks its header and section bounds, not its contents, so a file
damaged past its header still opens (and drafts what it holds); a lookup.bin is read whole
and its structure checked, but it has no checksum. 'ngramcache info --verify FILE' checks
every section's checksum of a .ngst.

--chat wraps the prompt as one user message in the model's own chat template (its GGUF's,
or --chat-template-file's), as serve's chat endpoint does; -sys adds a system message
before it. The template's end-of-turn tokens end the answer; the rendered prompt is what
is echoed and what the figures count.

examples:
  python -m ngramcache generate -p "def fib(n):" -n 64
  python -m ngramcache generate -m smollm2 --chat -p "Name three prime numbers." --color
  python -m ngramcache generate -m smollm2 -sys "Answer in one sentence." -p "What is a prime?"
  python -m ngramcache generate -m model.gguf -f prompt.txt -lcs corpus.ngst -lcd dyn.bin --color
  python -m ngramcache generate -f prompt.txt --no-draft        # plain decoding, to compare
  python -m ngramcache generate -f prompt.txt --drafter suffix

exit status: 0 ok, 1 missing/unreadable file or missing llama-cpp-python, 2 bad arguments, an
empty prompt, or --chat on a model without a chat template.
"""


def add_parser(sub) -> None:
    p = command_parser(sub, "generate", run, help=HELP, description=DESCRIPTION, epilog=EPILOG)
    add_prompt_input(p, required=True, prompt_help="prompt text")
    p.add_argument("-lcs", "--lookup-cache-static", metavar="FNAME",
                   help="static cache: ngramcache static table (.ngst) or llama.cpp lookup.bin")
    p.add_argument("-lcd", "--lookup-cache-dynamic", metavar="FNAME",
                   help="dynamic cache (llama.cpp lookup.bin): read if it exists, updated and written at the end")
    add_draft_length_flag(p, p, N_DRAFT, "; with adaptive drafting only what pays is verified")
    p.add_argument("-n", "--n-predict", type=int, default=128, metavar="N",
                   help="tokens to generate; -1 = until end of text or a full context (default: 128)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N", help="context size (default: 4096)")
    p.add_argument("-b", "--batch-size", type=int, default=512, metavar="N", help="prompt batch size (default: 512)")
    add_threads_flag(p)
    p.add_argument("--temp", type=float, default=0.0, metavar="T", help="temperature; 0 = greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=0, metavar="N", help="top-k sampling, 0 = off (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="top-p sampling, 1 = off (default: 1)")
    p.add_argument("-s", "--seed", type=int, default=None, metavar="N",
                   help="sampling seed (with --temp > 0): the same seed gives the same text with or without drafts")
    p.add_argument("--color", action="store_true", help="colour the tokens that came from accepted drafts")
    p.add_argument("--no-draft", action="store_true", help="plain decoding, one token per step")
    p.add_argument("--fixed-draft", action="store_true",
                   help="llama-lookup's behaviour: its lookup drafts only, always up to --spec-draft-n-max tokens")
    p.add_argument("--no-copy", action="store_true",
                   help="the same as --drafter lookup: llama.cpp's lookup drafts only (no copies of earlier spans)")
    p.add_argument("--no-prompt", action="store_true", help="do not echo the prompt")
    p.add_argument("--chat", action="store_true",
                   help="send the prompt as one user message in the model's chat template (as serve's "
                        "chat endpoint does); the template's end-of-turn tokens end the answer")
    p.add_argument("-sys", "--system", "--system-prompt", metavar="TEXT", dest="system",
                   help="a system message before the prompt (implies --chat); escape sequences are "
                        "processed unless --no-escape")
    p.add_argument("--chat-template-file", metavar="FNAME",
                   help="a Jinja2 chat template to use instead of the one in the model's GGUF (implies --chat)")
    from ngramcache.drafters.catalog import DEFAULT_DRAFTER

    add_drafter_flags(p, DEFAULT_DRAFTER, "what drafts")
    add_output_flags(p, "the text and figures")


def run(args) -> int:
    import ngramcache.integrations.llama as nl
    from ngramcache.cache import NgramCache
    from ngramcache.decoding.gate import gated_drafter, why_no_drafts
    from ngramcache.decoding.text_sink import TextSink
    from ngramcache.files import open_cache
    from ngramcache.models import model_path

    check_draft_length(args)
    check_ranges(args, [("n_predict", -1, "-n must be >= -1"),
                        ("ctx_size", 8, "-c must be >= 8"), ("batch_size", 1, "-b must be >= 1"),
                        ("threads", 1, "-t must be >= 1"), ("seed", 0, "--seed must be >= 0")])
    if args.temp < 0:
        raise UsageError(f"--temp must be >= 0, got {args.temp}")
    if args.no_copy:
        if args.drafter not in ("lookup", "copy"):
            raise UsageError(f"--no-copy means --drafter lookup; it contradicts --drafter {args.drafter}")
        args.drafter = "lookup"
    if args.fixed_draft and args.drafter == "copy":
        args.drafter = "lookup"  # llama-lookup's own drafts
    options = drafter_options(args)
    if args.drafter not in ("lookup", "copy") and (args.lookup_cache_static or args.lookup_cache_dynamic):
        raise UsageError(f"-lcs and -lcd apply to --drafter lookup or copy, not {args.drafter}")
    if args.lookup_cache_dynamic:
        check_output_path(args.lookup_cache_dynamic)  # written after the generation
    prompt = read_prompt(args)
    messages, template = _chat_request(args, prompt)
    model = model_path(args.model)

    t0 = time.perf_counter()
    static = open_cache(args.lookup_cache_static) if args.lookup_cache_static else None
    dynamic = None
    if args.lookup_cache_dynamic and os.path.exists(args.lookup_cache_dynamic):
        dynamic = NgramCache.load(args.lookup_cache_dynamic)
    t_draft_flat = time.perf_counter() - t0

    llm = nl.make_llama(model, n_ctx=args.ctx_size, n_batch=args.batch_size, n_threads=args.threads)
    backend = nl.LlamaBackend.of(llm)
    shown = prompt.decode("utf-8", errors="replace")
    if messages is not None:
        prompt, shown = _chat_prompt(llm, messages, template)
    drafter = None
    if not args.no_draft:
        costs = None  # --fixed-draft: every proposal verified whole, as llama-lookup does
        if not (args.fixed_draft or args.n_draft == 0):
            costs = nl.learned_costs(llm, max_batch=min(args.n_draft + 1, backend.n_batch))
        try:
            drafter = gated_drafter(costs, args.drafter, args.n_draft, static=static, dynamic=dynamic, **options)
        except (ValueError, TypeError) as e:
            raise UsageError(f"--drafter {args.drafter}: {e}") from None
    n_predict = args.n_predict if args.n_predict >= 0 else args.ctx_size

    out = sys.stdout
    show = not args.json
    if show and not args.no_prompt:
        out.write("\n\n" + shown)
        out.flush()
    sink = TextSink(backend)

    def on_tokens(tokens, n_from_draft):
        if not show:
            return
        drafted, own = sink.split(tokens, n_from_draft)
        if drafted:
            out.write(f"\x1b[34m{drafted}\x1b[0m" if args.color else drafted)
        out.write(own)
        out.flush()

    r = nl.generate(llm, prompt, drafter, n_predict, temperature=args.temp, seed=args.seed,
                    top_k=args.top_k, top_p=args.top_p, on_tokens=on_tokens)
    if show:
        out.write(sink.flush() + "\n\n")
        out.flush()
    inner = getattr(drafter, "drafter", drafter)  # the drafter behind the gate keeps the caches
    if inner is not None and args.lookup_cache_dynamic and hasattr(inner, "save_dynamic"):
        inner.save_dynamic(args.lookup_cache_dynamic)

    t_gen = r.t_total - r.t_prompt
    figures = {
        "n_prompt": r.n_prompt, "t_prompt": r.t_prompt,
        "n_decoded": r.n_tokens, "t_decode": t_gen,
        "n_draft": args.n_draft if drafter is not None else 0,
        "n_predict": r.n_tokens, "n_drafted": r.drafted, "n_accept": r.accepted,
        "accept": 100.0 * r.accepted / r.drafted if r.drafted else None,
        "t_draft_flat": t_draft_flat, "t_draft": r.t_draft, "t_verify": r.t_verify, "t_total": r.t_total,
        "steps": r.steps, "stop_reason": r.stop_reason,
        "adaptive": drafter is not None and getattr(drafter, "gate", None) is not None,
        "drafter": args.drafter if drafter is not None else None,
        "chat": messages is not None,
        # one sentence when a drafter drafted nothing (the gate found no draft worth it, or
        # the drafter had nothing to propose); None otherwise
        "why_no_drafts": why_no_drafts(drafter) if r.steps and not r.drafted else None,
    }
    # llama-lookup's closing block, on stderr as llama.cpp logs it
    speeds = (f"encoded {r.n_prompt:4d} tokens in {r.t_prompt:8.3f} seconds, speed: "
              f"{r.n_prompt / r.t_prompt if r.t_prompt > 0 else 0:8.3f} t/s\n"
              f"decoded {r.n_tokens:4d} tokens in {t_gen:8.3f} seconds, speed: "
              f"{r.n_tokens / t_gen if t_gen > 0 else 0:8.3f} t/s\n")
    per = f", {r.t_draft * 1e6 / r.drafted:.2f} us per token" if r.drafted else ""
    rows = [("n_draft", str(figures["n_draft"])), ("n_predict", str(r.n_tokens)), ("n_drafted", str(r.drafted)),
            ("t_draft_flat", f"{t_draft_flat * 1e3:.2f} ms"), ("t_draft", f"{r.t_draft * 1e3:.2f} ms{per}"),
            ("t_verify", f"{r.t_verify * 1e3:.2f} ms in {r.steps} steps"), ("n_accept", str(r.accepted)),
            ("accept", f"{figures['accept']:.3f}%" if r.drafted else "-")]
    if figures["why_no_drafts"]:
        rows.append(("why", figures["why_no_drafts"]))
    if args.quiet and not args.json:
        return 0  # the text alone: the figures are the block's, or --json's
    return emit(args, {"text": r.text, **figures}, title=speeds, rows=rows, indent="", sep=" = ", file=sys.stderr)


def _chat_request(args, prompt: bytes) -> tuple[list[dict] | None, str | None]:
    """The messages --chat sends (None without it) and the template --chat-template-file
    gives; read before the model loads, so that bad text or a missing file fails at once."""
    from ngramcache.corpus.text import prompt_text

    if not (args.chat or args.system is not None or args.chat_template_file):
        return None, None
    messages = []
    if args.system is not None:
        messages.append({"role": "system", "content": _text(prompt_text(args.system, escape=not args.no_escape),
                                                             "the system message (-sys)")})
    messages.append({"role": "user", "content": _text(prompt, "the prompt")})
    template = None
    if args.chat_template_file:
        with open(args.chat_template_file, encoding="utf-8") as f:
            template = f.read()
    return messages, template


def _text(raw: bytes, what: str) -> str:
    # a chat template renders text: bytes that are not UTF-8 have no message to go in
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{what} is not UTF-8 text (byte {e.start}); --chat needs text") from None


def _chat_prompt(llm, messages: list[dict], template: str | None):
    """(token ids, text) of ``messages`` rendered by the chat template, tokenized as serve does."""
    from ngramcache.serving.chat_template import ChatTemplate

    chat = ChatTemplate.of(llm, template)
    if chat is None:
        raise InputError("this model has no chat template in its GGUF; give one with --chat-template-file")
    try:
        text = chat.render(messages)
    except ValueError as e:
        raise InputError(str(e)) from None
    return chat.tokenize(llm, text), text
