"""The input flags: a corpus to tokenize (create, stats) and a prompt (generate, demo),
declared once so that the same flag means the same thing in every command."""

from __future__ import annotations

from ngramcache.cli._common import InputError, RunError, UsageError, check_ranges, note

NO_ESCAPE_HELP = "do not process escape sequences (\\n, \\t, \\xHH ...) in the text (llama.cpp's --no-escape)"


# -- a corpus: text files and a tokenizer, or token ids ------------------------------------

def add_text_input(p, title: str = "input (text and a tokenizer, or tokens)") -> None:
    src = p.add_argument_group(title)
    src.add_argument("-m", "--model", metavar="MODEL",
                     help="GGUF model whose tokenizer reads the text (only its vocabulary is loaded), "
                          "or a packaged model: smollm2, gemma")
    src.add_argument("--tokenizer", "--tokenizer-json", dest="tokenizer", metavar="TOKENIZER_JSON",
                     help="Hugging Face tokenizer.json to use instead of a GGUF model (needs the 'tokenizers' package)")
    src.add_argument("-f", "--file", dest="files", action="extend", nargs="+", metavar="PATH", default=[],
                     help="text file or directory to read (tokenized like llama.cpp's -f); repeat or list "
                          "several: their tokens are concatenated")
    src.add_argument("--tokens", metavar="FILE",
                     help="read token ids instead of text: raw little-endian int32 (no header), or .npy")
    src.add_argument("--no-escape", action="store_true", help=NO_ESCAPE_HELP)
    src.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                     help="tokenizer worker processes for long texts (default: one less than the CPUs; 1 = none)")
    src.add_argument("--piece-size", type=int, default=None, metavar="BYTES",
                     help="tokenize long texts in pieces of about this many bytes (default 65536; "
                          "0 = one tokenizer call per file, exactly as llama.cpp)")


def check_text_input(args) -> None:
    if args.tokens and (args.files or args.model or args.tokenizer):
        raise UsageError("--tokens replaces -m/--tokenizer and -f; "
                         "give either --tokens FILE or a tokenizer and -f FILE")
    if not args.tokens:
        if not args.files:
            raise UsageError("no input: give -f FILE (with -m MODEL or --tokenizer) or --tokens FILE, "
                             "exactly one of them")
        if not (args.model or args.tokenizer):
            raise UsageError("-f needs a tokenizer: give exactly one tokenizer, -m MODEL.gguf or "
                             "--tokenizer tokenizer.json")
        if args.model and args.tokenizer:
            raise UsageError("give exactly one tokenizer: -m MODEL.gguf or --tokenizer tokenizer.json, not both")
    check_ranges(args, [("jobs", 1, "-j/--jobs must be at least 1"), ("piece_size", 0, "--piece-size must be >= 0")])


def text_files(args) -> tuple[list, list]:
    """(files, skipped): the files -f names (directories expanded), binary ones skipped
    with a note; a RunError when none is left. Every file is read from before any work
    starts, so that one that cannot be read fails now, by name, not after the others were
    tokenized or on a worker."""
    from ngramcache.corpus.text import read_input
    from ngramcache.files import expand_inputs

    files, skipped = expand_inputs(args.files)
    if not files:
        raise RunError("no text files found in " + ", ".join(args.files)
                       + (f" ({len(skipped)} binary files skipped)" if skipped else ""))
    for f in files:
        read_input(f, 1)
    if skipped:
        note(args, skipped_note(args.command, skipped))
    return files, skipped


#: binary files named in the note on skipped files (a directory may hold hundreds; --json lists all)
SKIPPED_NAMED = 3


def skipped_note(command: str, skipped: list) -> str:
    """One line for the binary files a directory's expansion skipped: their count and the first few."""
    names = ", ".join(str(s) for s in skipped[:SKIPPED_NAMED])
    more = f" and {len(skipped) - SKIPPED_NAMED} more (--json lists them all)" if len(skipped) > SKIPPED_NAMED else ""
    files = "file" if len(skipped) == 1 else "files"
    return f"{command}: skipped {len(skipped)} binary {files} (a NUL byte in the first 8 KiB): {names}{more}"


def read_text_input(args, timer) -> tuple:
    """The input's tokens, and what the summary says about where they came from
    (``inputs``, then for text ``input_bytes``, ``skipped_binary_files``, ``tokenizer``).
    Stages: ``read`` for token files; ``load tokenizer`` and ``tokenize`` for text."""
    from ngramcache.files import read_tokens_file
    from ngramcache.progress import Progress
    from ngramcache.corpus.tokenizers import load_tokenizer, tokenize_files

    if args.tokens:
        with timer.stage("read"):
            tokens = read_tokens_file(args.tokens)
        return tokens, {"inputs": [args.tokens]}
    files, skipped = text_files(args)
    with timer.stage("load tokenizer"):
        tok = load_tokenizer(model=args.model, tokenizer_json=args.tokenizer)
    total = sum(f.stat().st_size for f in files)
    with timer.stage("tokenize"), Progress(total=total, desc="tokenizing", unit="B", quiet=args.quiet) as bar:
        tokens = tokenize_files(files, tok, escape=not args.no_escape, jobs=args.jobs, progress=bar,
                                piece_bytes=args.piece_size)
    info = {"inputs": [str(f) for f in files], "input_bytes": total}
    if skipped:
        info["skipped_binary_files"] = [str(s) for s in skipped]
    info["tokenizer"] = tok.path
    return tokens, info


# -- a prompt and the model that reads it -----------------------------------------------------------------------------

def add_model_flag(p, default: str | None = None, reason: str | None = None) -> None:
    """``-m/--model`` of the commands that run a model: one default for all of them
    (:data:`ngramcache.models.DEFAULT_MODEL`), named with its reason in --help."""
    from ngramcache.models import DEFAULT_MODEL, DEFAULT_MODEL_REASON, PACKAGED_MODELS

    if default is None:
        default, reason = DEFAULT_MODEL, DEFAULT_MODEL_REASON
    described = PACKAGED_MODELS[default].split(" (")[0]
    p.add_argument("-m", "--model", metavar="MODEL", default=default,
                   help=f"GGUF model file, or a packaged model: {', '.join(PACKAGED_MODELS)} "
                        f"(default: {default}, {described}: {reason})")


def add_prompt_input(p, *, required: bool, prompt_help: str, model: str | None = None,
                     model_reason: str | None = None) -> None:
    """-m (``model``: another default than every other command's, with its reason), -p or -f
    for the prompt, --no-escape."""
    add_model_flag(p, model, model_reason)
    src = p.add_mutually_exclusive_group(required=required)
    src.add_argument("-p", "--prompt", help=f"{prompt_help}; escape sequences are processed unless --no-escape")
    src.add_argument("-f", "--file", metavar="FNAME",
                     help="file holding the prompt, read like llama.cpp's -f: one trailing newline dropped, "
                          "escape sequences processed unless --no-escape")
    p.add_argument("--no-escape", action="store_true", help=NO_ESCAPE_HELP)


def add_threads_flag(p) -> None:
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="threads for single tokens and batches alike (default: usable cores, at most 8)")


def read_prompt(args) -> bytes | None:
    """The prompt's bytes as llama.cpp's tools see them (None: neither -p nor -f given)."""
    from ngramcache.corpus.text import prompt_text, read_text_file

    if args.file is not None:
        prompt = read_text_file(args.file, escape=not args.no_escape)
    elif args.prompt is not None:
        prompt = prompt_text(args.prompt, escape=not args.no_escape)
    else:
        return None
    if not prompt:
        raise InputError("the prompt is empty")
    return prompt
