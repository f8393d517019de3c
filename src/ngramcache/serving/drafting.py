"""A job's drafting: the request's ``speculative`` object against the engine's defaults,
checked in one place (the HTTP layer passes the object through as it came)."""

from __future__ import annotations

from ngramcache.serving.errors import RequestError

__all__ = ["resolve_speculative"]

_SPECULATIVE_FIELDS = ("enabled", "drafter", "n_draft")


def resolve_speculative(spec, drafter: str | None, n_draft: int) -> tuple[str | None, int]:
    """(drafter name or None for plain decoding, longest draft) for a request's
    ``speculative`` object on an engine whose defaults are ``drafter`` and ``n_draft``.
    A bad object raises ``RequestError`` naming the field."""
    from ngramcache.drafters.catalog import DRAFTERS

    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise RequestError(f"speculative must be an object, got {type(spec).__name__}", param="speculative")
    unknown = sorted(set(spec) - set(_SPECULATIVE_FIELDS))
    if unknown:
        raise RequestError(f"speculative: unknown field(s) {', '.join(map(str, unknown))} "
                           f"(known: {', '.join(_SPECULATIVE_FIELDS)})", param=f"speculative.{unknown[0]}")
    enabled = spec.get("enabled", True)
    if not isinstance(enabled, bool):
        raise RequestError(f"speculative.enabled must be true or false, got {enabled!r}",
                           param="speculative.enabled")
    name = spec.get("drafter", drafter)
    if name is not None and name not in DRAFTERS:
        raise RequestError(f"speculative.drafter: unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}",
                           param="speculative.drafter")
    n = spec.get("n_draft", n_draft)
    if n is None:
        n = n_draft
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 256:
        raise RequestError(f"speculative.n_draft must be an integer in [0, 256], got {n!r}",
                           param="speculative.n_draft")
    if not enabled or name is None or n == 0:
        return None, 0
    return name, n
