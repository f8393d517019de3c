"""A job's drafting: the request's ``speculative`` object against the engine's defaults,
checked in one place (the HTTP layer passes the object through as it came), with the
drafter registry (``ngramcache.drafters.registry``) for the drafter's name and options."""

from __future__ import annotations

from typing import Any, NamedTuple

from ngramcache.defaults import MAX_DECODE_DRAFT
from ngramcache.serving.errors import RequestError

__all__ = ["DraftPlan", "resolve_speculative"]

_FIELDS = ("enabled", "drafter", "n_draft", "options")


class DraftPlan(NamedTuple):
    """How a job drafts: ``drafter`` (a registered name; None: plain decoding), its
    longest draft ``n_draft``, and the request's own ``options`` for it, checked."""

    drafter: str | None
    n_draft: int
    options: dict[str, Any]


def resolve_speculative(spec, drafter: str | None, n_draft: int) -> DraftPlan:
    """The plan for a request's ``speculative`` object (None: the defaults) on an engine
    whose defaults are ``drafter`` and ``n_draft``. A bad object raises ``RequestError``
    whose ``param`` names the field (``speculative.options.max_depth``)."""
    from ngramcache.drafters import registry

    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise RequestError(f"speculative must be an object, got {type(spec).__name__}", param="speculative")
    unknown = sorted(map(str, set(spec) - set(_FIELDS)))
    if unknown:
        raise RequestError(f"{', '.join('speculative.' + k for k in unknown)}: unknown (the fields of speculative: "
                           f"{', '.join(_FIELDS)})", param=f"speculative.{unknown[0]}")
    enabled = spec.get("enabled", True)
    if not isinstance(enabled, bool):
        raise RequestError(f"speculative.enabled must be true or false, got {enabled!r}",
                           param="speculative.enabled")
    name = spec.get("drafter", drafter)
    n = spec.get("n_draft", n_draft)
    if n is None:
        n = n_draft
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_DECODE_DRAFT:
        raise RequestError(f"speculative.n_draft must be an integer in [0, {MAX_DECODE_DRAFT}], got {n!r}",
                           param="speculative.n_draft")
    options = spec.get("options")
    if name is None:
        if options:
            raise RequestError("speculative.options: no drafter to give them to (name one in speculative.drafter)",
                               param="speculative.options")
        return DraftPlan(None, 0, {})
    try:
        drafter_spec = registry.spec(name)
    except registry.UnknownDrafterError as e:
        raise RequestError(f"speculative.drafter: {e}", param="speculative.drafter") from None
    try:
        checked = drafter_spec.validate_options({} if options is None else options)
    except registry.OptionError as e:
        where = "speculative.options" if e.param == "options" else f"speculative.options.{e.param}"
        raise RequestError(f"{where}: {e} (drafter {name!r})", param=where) from None
    if not enabled or n == 0:
        return DraftPlan(None, 0, {})
    return DraftPlan(name, n, checked)
