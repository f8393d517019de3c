#!/usr/bin/env bash
# Builds llama.cpp's own llama-lookup-create and llama-lookup-stats from the llama.cpp vendored in
# the pinned llama-cpp-python sdist, outside the repository, for side-by-side benchmarks.
#
#   bench/build_llamacpp.sh [DIR]     (DIR defaults to $NGRAMCACHE_LLAMACPP_DIR or ~/.cache/ngramcache/llamacpp)
#
# Prints the folder that holds the two binaries. A second run reuses the build (about 15 minutes
# the first time on 2 cores). Nothing of llama.cpp is committed to this repository.
set -euo pipefail

VERSION=0.3.36
DIR="${1:-${NGRAMCACHE_LLAMACPP_DIR:-$HOME/.cache/ngramcache/llamacpp}}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$DIR"
cd "$DIR"

BIN="$DIR/build/bin"
if [[ -x "$BIN/llama-lookup-stats" && -x "$BIN/llama-lookup-create" ]]; then
    echo "$BIN"
    exit 0
fi

SDIST="llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
    "$PYTHON" -m pip download -q --no-deps --no-build-isolation --no-binary llama-cpp-python \
        "llama-cpp-python==$VERSION" -d "$DIR" >&2
fi
SRC="$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [[ ! -d "$SRC" ]]; then
    tar -xzf "$SDIST" -C "$DIR"
fi

cmake -S "$SRC" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF >&2
cmake --build "$DIR/build" -j"$(nproc)" --target llama-lookup-create llama-lookup-stats >&2
echo "$BIN"
