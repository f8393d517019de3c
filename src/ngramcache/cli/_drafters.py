"""The drafter flags shared by generate, demo and stats: ``--drafter NAME`` and each
drafter's own options, under llama.cpp's option names where llama.cpp has the drafter."""

from __future__ import annotations

from ngramcache.cli._common import UsageError

# (flag, dest, type, drafter names it applies to, option keyword, help)
_OPTIONS = [
    ("--spec-ngram-simple-size-n", "simple_size_n", int, ("simple",), "size_n",
     "ngram-simple: tokens matched (1-1024; default 12)"),
    ("--spec-ngram-simple-size-m", "simple_size_m", int, ("simple",), "size_m",
     "ngram-simple: most tokens copied (1-1024; default 48)"),
    ("--spec-ngram-map-k-size-n", "map_k_size_n", int, ("map-k",), "size_n",
     "ngram-map-k: key size (1-1024; default 12)"),
    ("--spec-ngram-map-k-size-m", "map_k_size_m", int, ("map-k",), "size_m",
     "ngram-map-k: value size (1-1024; default 48)"),
    ("--spec-ngram-map-k-min-hits", "map_k_min_hits", int, ("map-k",), "min_hits",
     "ngram-map-k: minimum hits (>= 1; default 1)"),
    ("--spec-ngram-map-k4v-size-n", "map_k4v_size_n", int, ("map-k4v",), "size_n",
     "ngram-map-k4v: key size (1-1024; default 12)"),
    ("--spec-ngram-map-k4v-size-m", "map_k4v_size_m", int, ("map-k4v",), "size_m",
     "ngram-map-k4v: value size (1-1024; default 48)"),
    ("--spec-ngram-map-k4v-min-hits", "map_k4v_min_hits", int, ("map-k4v",), "min_hits",
     "ngram-map-k4v: minimum hits of a key (>= 1; default 1)"),
    ("--spec-ngram-mod-n-match", "mod_n_match", int, ("mod",), "n_match",
     "ngram-mod: tokens hashed per lookup (1-1024; default 24)"),
    ("--spec-ngram-mod-n-min", "mod_n_min", int, ("mod",), "n_min",
     "ngram-mod: shortest draft (0-1024; default 48)"),
    ("--spec-ngram-mod-n-max", "mod_n_max", int, ("mod",), "n_max",
     "ngram-mod: longest draft (0-1024; default 64)"),
    ("--pld-max-ngram", "pld_max_ngram", int, ("pld",), "max_ngram",
     "prompt lookup: longest n-gram matched (default 3)"),
    ("--pld-min-ngram", "pld_min_ngram", int, ("pld",), "min_ngram",
     "prompt lookup: shortest n-gram matched (default 1)"),
    ("--pld-match", "pld_match", str, ("pld",), "match",
     "prompt lookup: which earlier occurrence, 'first' (as Hugging Face, llama-cpp-python and vLLM) or "
     "'recent' (the newest, as ngram-simple; default first)"),
    ("--suffix-max-depth", "suffix_max_depth", int, ("suffix",), "max_depth",
     "suffix drafter: longest match counted (1-1024; default 64)"),
    ("--suffix-min-prob", "suffix_min_prob", float, ("suffix",), "min_prob",
     "suffix drafter: stop the draft where its estimated probability falls below this (0-1; default 0.1)"),
]


def add_drafter_flags(p, default: str, what: str) -> None:
    """``--drafter`` (default ``default``) and each drafter's options, in one group."""
    from ngramcache.drafters.catalog import DRAFTERS

    g = p.add_argument_group("drafter")
    names = ", ".join(DRAFTERS)
    g.add_argument("--drafter", default=default, metavar="NAME", choices=list(DRAFTERS),
                   help=f"{what}: {names} (default: {default}; see docs/drafters.md)")
    for flag, dest, typ, _, _, help_ in _OPTIONS:
        g.add_argument(flag, dest=dest, type=typ, default=None, metavar="N" if typ is not str else "NAME",
                       help=help_)


def drafter_options(args) -> dict:
    """The options given for the chosen drafter, as its constructor's keywords; an option
    of another drafter is a usage error."""
    out = {}
    for flag, dest, _, names, key, _ in _OPTIONS:
        value = getattr(args, dest, None)
        if value is None:
            continue
        if args.drafter not in names:
            raise UsageError(f"{flag} applies to --drafter {' or '.join(names)}, not {args.drafter}")
        out[key] = value
    return out


def build_drafter(args, n_draft: int, gate=None, **extra):
    """The chosen drafter; a bad option value is a usage error with the drafter's message."""
    from ngramcache.drafters.catalog import make_drafter

    try:
        return make_drafter(args.drafter, n_draft=n_draft, gate=gate, **drafter_options(args), **extra)
    except (ValueError, TypeError) as e:
        raise UsageError(f"--drafter {args.drafter}: {e}") from None
