#!/usr/bin/env bash
# Builds and runs one fuzz target for SECONDS (default 600), nice'd, one job:
#   fuzz/run.sh TARGET [SECONDS] [more libFuzzer flags]
# C++ targets (lookup, ngst): clang++ with libFuzzer, AddressSanitizer and UBSan.
# Python targets (tokens_file, cache_files, saved_state, cost_store, cli): atheris, with the package's
# extension built with AddressSanitizer and UBSan (NGRAMCACHE_SANITIZE=ON) for the run and
# rebuilt without it afterwards.
# New inputs go to build/fuzz/work/TARGET (the committed corpus is only read), findings to
# build/fuzz/findings/TARGET/, the log to build/fuzz/TARGET.log.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:?usage: fuzz/run.sh TARGET [SECONDS] [libFuzzer flags]}"
seconds="${2:-600}"
shift $(( $# >= 2 ? 2 : 1 ))
py="${PYTHON:-.venv/bin/python}"
work="build/fuzz/work/$target"
found="build/fuzz/findings/$target"
mkdir -p "$work" "$found" fuzz/crashers/"$target"
flags=(-max_total_time="$seconds" -print_final_stats=1 -timeout=20 -rss_limit_mb=4096
       -artifact_prefix="$found/" "$@")
inputs=("$work" fuzz/corpus/"$target" fuzz/crashers/"$target")

case "$target" in
  lookup|ngst)
    exe="build/fuzz/${target}_fuzz"
    clang++ -std=c++17 -O2 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
        -fno-omit-frame-pointer -Icpp/include -Ifuzz "fuzz/${target}_fuzz.cpp" -o "$exe"
    # short allocation stacks: unwinding them at every malloc halves the speed otherwise
    ASAN_OPTIONS="${ASAN_OPTIONS:-malloc_context_size=2}" \
        nice -n 10 "$exe" "${flags[@]}" "${inputs[@]}" 2>&1 | tee "build/fuzz/$target.log"
    ;;
  tokens_file|cache_files|saved_state|cost_store|cli)
    # atheris brings its own libFuzzer, but a sanitizer runtime preloaded beside it
    # (gcc's libasan) defines the coverage hooks too and blinds it. So: one runtime with
    # clang's ASan (UBSan included) and libFuzzer together, preloaded, and the extension
    # built with clang against it; atheris then uses the libFuzzer already loaded.
    rt="build/fuzz/asan_with_fuzzer.so"
    if [ ! -f "$rt" ]; then
        lib="$(clang++ -print-resource-dir)/lib/linux"
        rm -rf build/fuzz/rt && mkdir -p build/fuzz/rt
        (cd build/fuzz/rt && ar x "$lib/libclang_rt.asan-x86_64.a" && rm -f asan_preinit.cpp.o &&
         ar x "$lib/libclang_rt.asan_cxx-x86_64.a" && ar x "$lib/libclang_rt.fuzzer_no_main-x86_64.a")
        clang++ -shared -o "$rt" build/fuzz/rt/*.o -lpthread -ldl -lrt -lstdc++
    fi
    rebuild() {  # the sanitized build in a folder of its own, so that both stay cached
        if [ "$1" = ON ]; then
            CC=clang CXX=clang++ nice -n 10 "$py" -m pip install --no-build-isolation --no-deps -q -e . \
                -Ccmake.define.NGRAMCACHE_SANITIZE=ON -Cbuild-dir=build/ext-sanitize-clang
        else
            nice -n 10 "$py" -m pip install --no-build-isolation --no-deps -q -e .
        fi
    }
    rebuild ON
    trap 'rebuild OFF' EXIT
    # Leaks are not findings here (the interpreter keeps memory until exit);
    # allocator_may_return_null: a huge allocation is Python's MemoryError, not a crash.
    LD_PRELOAD="$PWD/$rt" \
    ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:malloc_context_size=2 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        nice -n 10 "$py" fuzz/py_fuzz.py "$target" "${flags[@]}" "${inputs[@]}" 2>&1 | tee "build/fuzz/$target.log"
    ;;
  *) echo "unknown target $target (lookup, ngst, tokens_file, cache_files, saved_state, cost_store, cli)" >&2; exit 2 ;;
esac
