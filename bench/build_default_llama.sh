#!/usr/bin/env bash
# Builds llama-cpp-python as a user installs it (pip's defaults: llamafile's kernels, built for
# this machine's CPU) into a folder of its own, outside the README's install, so that `demo`,
# bench/bench_quant_types.py and bench/bench_vs_default.py can compare ngramcache with what a
# user had before installing it.
#
#   bench/build_default_llama.sh [DIR]   (DIR: $NGRAMCACHE_DEFAULT_BUILD, else ~/.cache/ngramcache/llama-default)
#
# Compiles llama.cpp from source: 5-10 minutes on 2 cores, once (a second run finds the build).
# --no-cache-dir: pip's wheel cache is keyed by the source package, not by CMAKE_ARGS, and would
# hand back the README's exact build. Prints the folder.
set -euo pipefail
DIR="${1:-${NGRAMCACHE_DEFAULT_BUILD:-$HOME/.cache/ngramcache/llama-default}}"
PYTHON="${PYTHON:-python3}"
if [[ -f "$DIR/llama_cpp/__init__.py" ]]; then
    echo "$DIR"
    exit 0
fi
echo "building llama-cpp-python 0.3.36 with pip's defaults into $DIR (5-10 minutes on 2 cores) ..." >&2
tmp="$DIR.tmp.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
env -u CMAKE_ARGS "$PYTHON" -m pip install -q --no-cache-dir --no-deps --target "$tmp" "llama-cpp-python==0.3.36" >&2
if "$PYTHON" -c 'import sys; sys.path.insert(0, sys.argv[1]); import llama_cpp; sys.exit(b"LLAMAFILE = 1" not in llama_cpp.llama_print_system_info())' "$tmp"; then
    :
else
    echo "the build has no llamafile kernels: CMAKE_ARGS or a pip config file turned them off" >&2
    exit 1
fi
mkdir -p "$(dirname "$DIR")"
rm -rf "$DIR"
mv "$tmp" "$DIR"
trap - EXIT
echo "$DIR"
