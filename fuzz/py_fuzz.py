"""Runs one Python-level fuzz target (fuzz/targets.py) under atheris:

    python fuzz/py_fuzz.py TARGET [libFuzzer flags] [CORPUS_DIR ...]

e.g. ``python fuzz/py_fuzz.py tokens_file -max_total_time=600 build/fuzz/work/tokens_file
fuzz/corpus/tokens_file``. docs/fuzzing.md has the sanitizer setup for the C++ core."""

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))

import targets  # noqa: E402

# The package is an editable install, whose import hook atheris cannot instrument through
# (its coverage stays near zero): instrument the loaded code instead, once the targets and
# every module they use are imported.
targets.warm_up()
atheris.instrument_all()


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in targets.TARGETS:
        sys.exit(f"usage: {sys.argv[0]} TARGET [libFuzzer flags] [CORPUS ...]; targets: "
                 + ", ".join(targets.TARGETS))
    target = targets.TARGETS[sys.argv[1]]
    # libFuzzer reruns its argv[0] through the shell for -merge=1 and -fork: the whole
    # command, so that the child runs the same interpreter and target.
    argv0 = f"{sys.executable} {Path(__file__).resolve()} {sys.argv[1]}"
    atheris.Setup([argv0] + sys.argv[2:], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
