#!/usr/bin/env bash
# transformers on a CUDA GPU (bench/gpu_check.py: verification cost curve, batched-vs-one-token
# logits, end-to-end drafting speed; float32 and bfloat16), on a machine with no network and a
# small limit on what can be copied to it in one go.
#
#   bench/gpu_check.sh pack [DIR]       # here: everything the GPU machine needs, into DIR (.gpu)
#   bench/gpu_check.sh prepare [DIR]    # there: install ngramcache and gguf, keep part 1 of the model
#   bench/gpu_check.sh run OUT [DIR [OPTIONS]]  # there: rebuild the model file, check it, measure
#                                       # into OUT (OPTIONS go to gpu_check.py, e.g. --dtypes float32)
#
# pack writes (DIR defaults to .gpu, which should be git-ignored):
#   DIR/common/tree       ngramcache's sources at HEAD (what a build reads), so that the build
#                         there never sees half-edited files of the working tree
#   DIR/common/whl        the gguf wheel (transformers reads GGUF files through it)
#   DIR/common/tasks.json the end-to-end workloads' prompts, so both machines run the same text
#   DIR/common/config     the model's transformers config and tokenizer (random-weights fallback)
#   DIR/p1/part, DIR/p2/part, DIR/common/model.sha256
#                         the packaged SmolLM2 GGUF file cut in two, each half small enough to
#                         travel with the working tree in one call
# prepare copies DIR/p1/part outside the checkout (/tmp/ngc_stash) and builds ngramcache
# (pip install --no-build-isolation: scikit-build-core, pybind11, cmake and ninja must be
# there). run joins the stash with DIR/p2/part, checks the sha256, and runs gpu_check.py on
# the file; when part 1 is missing or the check fails it runs on random weights of the same
# architecture instead (DIR/common/config) and says so. PYTHON: the interpreter (python3).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STASH=/tmp/ngc_stash
MODEL_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
# torch's deterministic algorithms on CUDA need a fixed cuBLAS workspace; set for every
# setting, so that the settings differ in one switch only
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
export PYTHONUNBUFFERED=1

pack() {
    local dir=$1 model
    set -e
    rm -rf "$dir" && mkdir -p "$dir/common/tree" "$dir/common/whl" "$dir/p1" "$dir/p2"
    git archive HEAD CMakeLists.txt pyproject.toml README.md cpp/include cpp/bind src | tar -x -C "$dir/common/tree"
    git rev-parse HEAD >"$dir/common/commit"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d "$dir/common/whl" "gguf==$("$PY" -c 'import gguf, importlib.metadata as m; print(m.version("gguf"))')"
    model=$("$PY" -c 'import ngramcache.models as m; print(m.model_path("smollm2"))')
    head -c 49000000 "$model" >"$dir/p1/part"
    tail -c +49000001 "$model" >"$dir/p2/part"
    (cd "$(dirname "$model")" && sha256sum "$(basename "$model")") | awk -v n="$MODEL_NAME" '{print $1 "  " n}' \
        >"$dir/common/model.sha256"
    "$PY" - "$dir/common" <<'EOF'
import dataclasses, json, sys
from ngramcache import data, hf
out = sys.argv[1]
with open(f"{out}/tasks.json", "w", encoding="utf-8") as f:
    json.dump([dataclasses.asdict(t) for t in data.bench_tasks()], f)
model, tok = hf.load_model("smollm2")
model.config.save_pretrained(f"{out}/config")
tok.save_pretrained(f"{out}/config")
EOF
    du -sh "$dir"/*
}

prepare() {
    local dir=$1
    mkdir -p "$STASH"
    [ -f "$dir/p1/part" ] && cp "$dir/p1/part" "$STASH/part1"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
    "$PY" -m pip install -q --no-index --no-deps "$dir"/common/whl/*.whl || return 1
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip install -q --no-index --no-deps --no-build-isolation \
        "$dir/common/tree" || return 1
    # from outside the checkout, so that the installed copy (with its compiled core) is the one imported
    (cd /tmp && "$PY" -c 'import ngramcache, ngramcache._core, gguf, torch, transformers; print("ngramcache", ngramcache.__file__, "gguf", gguf.__file__, "torch", torch.__version__, torch.cuda.is_available(), "transformers", transformers.__version__)')
}

run() {
    local out=$1 dir=$2 model=/tmp/ngc_model/$MODEL_NAME
    shift 2
    (cd /tmp && "$PY" -c 'import ngramcache._core') 2>/dev/null || prepare "$dir" || return 1
    mkdir -p /tmp/ngc_model "$out"
    if [ -f "$STASH/part1" ] && [ -f "$dir/p2/part" ]; then
        cat "$STASH/part1" "$dir/p2/part" >"$model"
    fi
    echo "commit $(cat "$dir/common/commit")"
    if [ -f "$model" ] && (cd /tmp/ngc_model && sha256sum -c "$OLDPWD/$dir/common/model.sha256"); then
        "$PY" bench/gpu_check.py --model "$model" --tasks "$dir/common/tasks.json" --out "$out" "$@"
    else
        echo "model file missing or damaged: random weights of the same architecture"
        "$PY" bench/gpu_check.py --config "$dir/common/config" --tasks "$dir/common/tasks.json" --out "$out" "$@"
    fi
}

case "${1:-}" in
    pack) pack "${2:-.gpu}" ;;
    prepare) prepare "${2:-.gpu}" ;;
    run) [ $# -ge 2 ] || { echo "usage: $0 run OUT [DIR]" >&2; exit 2; }; out=$2 dir=${3:-.gpu}; shift $(($# < 3 ? $# : 3)); run "$out" "$dir" "$@" ;;
    *) echo "usage: $0 pack [DIR] | prepare [DIR] | run OUT [DIR]" >&2; exit 2 ;;
esac
