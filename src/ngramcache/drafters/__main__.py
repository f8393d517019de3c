"""``python -m ngramcache.drafters DOC.md ...``: refresh each document's drafter options
table (between its ``<!-- options table: begin ... -->`` and ``<!-- options table: end -->``
markers) from the registry."""

import sys

from ngramcache.drafters.registry import embed_options_table
from ngramcache.files import atomic_open


def main(paths: list[str]) -> int:
    for doc in paths:
        with open(doc, encoding="utf-8") as f:
            updated = embed_options_table(f.read())
        with atomic_open(doc, "w", encoding="utf-8") as f:
            f.write(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
