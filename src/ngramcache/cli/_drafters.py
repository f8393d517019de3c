"""The drafter flags shared by generate, demo, serve, chat and stats: ``--drafter NAME`` and
each registered drafter's own options (``ngramcache.drafters.registry``), under llama.cpp's
option names where llama.cpp has the drafter."""

from __future__ import annotations

from ngramcache.cli._common import UsageError, check_ranges
from ngramcache.defaults import MAX_DECODE_DRAFT

#: the draft-length flag of every command that drafts (llama.cpp's name); ``args.n_draft``
DRAFT_LENGTH_FLAG = "--spec-draft-n-max"


def _dest(spec, option) -> str:
    return f"drafter_{spec.name}_{option.name}".replace("-", "_")


def _parse_bool(text: str) -> bool:
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    try:
        return words[text.lower()]
    except KeyError:
        raise ValueError(text) from None


_PARSE = {int: int, float: float, str: str, bool: _parse_bool}
_METAVAR = {int: "N", float: "X", str: "NAME", bool: "BOOL"}


def add_drafter_flags(p, default: str, what: str) -> None:
    """``--drafter`` (default ``default``) and each registered drafter's options, in one group."""
    from ngramcache.drafters.registry import DRAFTERS, specs

    g = p.add_argument_group("drafter")
    names = ", ".join(DRAFTERS)
    g.add_argument("--drafter", default=default, metavar="NAME", choices=list(DRAFTERS),
                   help=f"{what}: {names} (default: {default}; see docs/drafters.md)")
    for spec in specs():
        for option in spec.options:
            g.add_argument(spec.flag(option), dest=_dest(spec, option), type=_PARSE[option.type], default=None,
                           metavar=_METAVAR[option.type], help=spec.help(option))


def add_draft_length_flag(p, group, default: int, why: str = "", lowest: int = 0, highest: int = MAX_DECODE_DRAFT,
                          aliases: tuple[str, ...] = ()) -> None:
    """``--spec-draft-n-max N`` in ``group`` of parser ``p``: ``args.n_draft``, the most tokens
    drafted per step, ``lowest`` to ``highest`` (``check_draft_length`` checks it), ``default``
    unless given; ``why`` follows the default in the help."""
    group.add_argument(DRAFT_LENGTH_FLAG, *aliases, type=int, default=default, metavar="N", dest="n_draft",
                       help=f"most tokens drafted per step, {lowest} to {highest} (default: {default}{why})")
    p.set_defaults(draft_length_range=(lowest, highest))


def check_draft_length(args) -> None:
    """A usage error when ``--spec-draft-n-max`` is outside the range its command declared."""
    lowest, highest = args.draft_length_range
    check_ranges(args, [("n_draft", lowest, f"{DRAFT_LENGTH_FLAG} must be {lowest} to {highest}", highest)])


def drafter_options(args) -> dict:
    """The options given for the chosen drafter, checked, as its constructor's keywords; an
    option of another drafter, or a bad value, is a usage error naming the flag."""
    from ngramcache.drafters.options import OptionError
    from ngramcache.drafters.registry import spec as spec_of, specs

    chosen = spec_of(args.drafter)
    given, flags = {}, {}
    for spec in specs():
        for option in spec.options:
            value = getattr(args, _dest(spec, option), None)
            if value is None:
                continue
            if spec is not chosen:
                raise UsageError(f"{spec.flag(option)} applies to --drafter {spec.name}, not {args.drafter}")
            given[option.name] = value
            flags[option.name] = spec.flag(option)
    try:
        return chosen.validate_options(given)
    except OptionError as e:
        raise UsageError(f"--drafter {args.drafter}: {flags.get(e.param, e.param)} {e.reason}") from None


def build_drafter(args, n_draft: int, **extra):
    """The chosen drafter; a bad option value is a usage error with the drafter's message."""
    from ngramcache.drafters.registry import make_drafter

    try:
        return make_drafter(args.drafter, n_draft=n_draft, **drafter_options(args), **extra)
    except (ValueError, TypeError) as e:
        raise UsageError(f"--drafter {args.drafter}: {e}") from None
