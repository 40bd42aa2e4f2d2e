#!/usr/bin/env bash
# One prepared run of edge-eagle on an NVIDIA GPU (the device tool's H200), with no network:
# a CUDA build of llama-cpp-python 0.3.36 for sm_90 only, `edge-eagle bench` on the GPU
# (plain, chains k = 1..5, auto, trees, upstream's C++ draft-eagle3 loop from the same
# source), then, if time remains, a drafter trained on the GPU.
#
# Before (here, on the CPU, ~20 s):   scripts/device/pack.sh    -> .device/part1..3 (git-ignored)
# Then three back-to-back device calls (the machine stays warm ~30 s between calls; each call
# carries at most 64 MiB with the working tree, so the 98 MB GGUF goes in three parts):
#   run(command="bash scripts/device/gpu_run.sh stage", carry=[".device/part1"], timeout_s=120)
#   run(command="bash scripts/device/gpu_run.sh stage", carry=[".device/part2"], timeout_s=60)
#   run(command="bash scripts/device/gpu_run.sh run \"$OUT\" 480", carry=[".device/part3"], timeout_s=540)
# The last call leaves at most 8 result files in $OUT: report.md, bench.json, bench.md,
# phases.json, train.json, eval.json, the trained drafter (Q8_0, ~12 MB) and run.log.
#
# Phases and expected times on the H200 (16 cores); each checks the clock against BUDGET_S
# (seconds from the start of this call) and is skipped when it would not finish:
#   setup   ~10 s   join and check the GGUF, install missing pure-Python wheels
#   build   ~3-5 min  cmake: GGML_CUDA, CMAKE_CUDA_ARCHITECTURES=90, targets llama and
#                   llama-speculative-simple only, -j $(nproc); installed into the source tree
#   bench   ~2 min  MT-bench subset (every 4th question, 20), 96 tokens, greedy, all layers on GPU
#   overhead ~40 s  scripts/bench_overhead.py, k = 1, 3, 5, fast path against Python path (in phases.json)
#   train   rest    extraction on the GPU (16 answers at once), training with --device cuda,
#                   the largest token budget that fits, then eval on the same MT-bench subset
#
# Dry run on this CPU (tiny sizes, the installed CPU llama-cpp-python of .venv, no CUDA;
# cmake only configures the slim source to prove it is complete), ~3 min. Not part of CI:
#   scripts/device/pack.sh && bash scripts/device/gpu_run.sh dry-run /tmp/gpu-dry
set -euo pipefail
MODE=${1:?usage: gpu_run.sh stage | run OUT BUDGET_S | dry-run OUT}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DEV="$REPO/.device"
T0=$(date +%s)
VERSION=0.3.36

if [ "$MODE" = stage ]; then  # a transfer: the carried part stays on the warm machine
    ls -la "$DEV"/part* 2>/dev/null | grep -v '^total' || true
    exit 0
fi

OUT=${2:?give an output folder}
BUDGET=${3:-480}
DRY=0
PY=${PYTHON:-python3}
if [ "$MODE" = dry-run ]; then DRY=1; BUDGET=${3:-900}; PY=${PYTHON:-$REPO/.venv/bin/python}; fi
mkdir -p "$OUT"
LOG="$OUT/run.log"
: > "$LOG"
PHASES="$OUT/phases.json"
echo "{}" > "$PHASES"
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG" >&2; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
phase() {  # name status seconds [extra json]
    "$PY" - "$PHASES" "$1" "$2" "$3" "${4:-{\}}" <<'PY'
import json, sys
path, name, status, secs, extra = sys.argv[1:6]
d = json.load(open(path))
d[name] = {"status": status, "seconds": int(secs), **json.loads(extra)}
json.dump(d, open(path, "w"), indent=1)
PY
}

# --- setup ------------------------------------------------------------------------------
t=$(date +%s)
WORK=${EDGE_EAGLE_DEVICE_WORK:-/tmp/edge-eagle-device}
mkdir -p "$WORK"
NAME=$(cat "$DEV/part1/smollm2.gguf.name")
GGUF="$WORK/$NAME"
if [ ! -f "$GGUF" ]; then
    for p in "$DEV/part1/smollm2.gguf.part00" "$DEV/part2/smollm2.gguf.part01" "$DEV/part3/smollm2.gguf.part02"; do
        [ -f "$p" ] || { log "missing $p: carry .device/part1, part2 and part3 in three back-to-back calls"; exit 2; }
    done
    cat "$DEV/part1/smollm2.gguf.part00" "$DEV/part2/smollm2.gguf.part01" "$DEV/part3/smollm2.gguf.part02" > "$GGUF.tmp"
    [ "$(sha256sum "$GGUF.tmp" | cut -d' ' -f1)" = "$(cat "$DEV/part1/smollm2.gguf.sha256")" ] \
        || { log "the joined GGUF's checksum differs: rerun pack.sh and the three transfers"; exit 2; }
    mv "$GGUF.tmp" "$GGUF"
fi
[ -f "$WORK/sharegpt-slice.jsonl" ] || gunzip -c "$DEV/part1/sharegpt-slice.jsonl.gz" > "$WORK/sharegpt-slice.jsonl"
SITE="$WORK/site"
mkdir -p "$SITE"
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
for mod in gguf jinja2 markupsafe yaml; do
    "$PY" -c "import $mod" 2>/dev/null || "$PY" -m pip install --quiet --no-deps --no-index \
        --find-links "$DEV/part1/wheels" --target "$SITE" "$( [ $mod = yaml ] && echo pyyaml || echo $mod )" >> "$LOG" 2>&1 \
        || log "could not install $mod from .device/part1/wheels"
done
# the native fast path (edge_eagle/_fastpath.c; ignored by git, so it never travels): one cc call
EXT=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
PYINC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
if [ ! -f "$REPO/edge_eagle/_fastpath$EXT" ]; then
    # with Python's headers the cycle is a CPython function; without, ctypes calls ee_cycle
    WITHPY=()
    if [ -f "$PYINC/Python.h" ]; then WITHPY=(-DEE_WITH_PYTHON "-I$PYINC"); fi
    ${CC:-cc} -O2 -std=c99 -shared -fPIC ${WITHPY[@]+"${WITHPY[@]}"} "$REPO/edge_eagle/_fastpath.c" -o "$REPO/edge_eagle/_fastpath$EXT" -lm >> "$LOG" 2>&1 \
        && log "built the native fast path" || log "no native fast path (cc failed, see run.log): the Python path runs"
fi
phase setup ok $(( $(date +%s) - t ))
log "setup done: $GGUF"

# --- build ------------------------------------------------------------------------------
t=$(date +%s)
SRC="$WORK/llama_cpp_python-$VERSION"
if [ ! -d "$SRC" ]; then tar -xzf "$DEV/part1/llama-cpp-python-$VERSION-slim.tar.gz" -C "$WORK"; fi
CMAKE_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DLLAVA_BUILD=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TESTS=OFF
             -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF
             -DSKBUILD_PLATLIB_DIR="$WORK/platlib")
if [ $DRY = 1 ]; then
    cmake -S "$SRC" -B "$WORK/build-cpu" "${CMAKE_FLAGS[@]}" >> "$LOG" 2>&1 \
        || { log "cmake could not configure the slim source (see run.log): fix pack.sh"; phase build failed 0; exit 1; }
    phase build "configured (dry run: the CPU build installed here is used)" $(( $(date +%s) - t ))
    log "dry run: the slim source configures; using the installed CPU llama-cpp-python"
    BIN=$(bash "$REPO/scripts/build_upstream.sh" 2>/dev/null || true)
else
    if [ ! -f "$SRC/llama_cpp/lib/libllama.so" ]; then
        cmake -S "$SRC" -B "$WORK/build" "${CMAKE_FLAGS[@]}" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
            -DGGML_NATIVE=OFF >> "$LOG" 2>&1 || { log "cmake configure failed (see run.log)"; phase build failed 0; exit 1; }
        cmake --build "$WORK/build" --target llama llama-speculative-simple -j "$(nproc)" >> "$LOG" 2>&1 \
            || { log "the CUDA build failed (see run.log)"; phase build failed $(( $(date +%s) - t )); exit 1; }
        cmake --install "$WORK/build" >> "$LOG" 2>&1 || true
    fi
    export PYTHONPATH="$SRC:$PYTHONPATH"
    BIN=$(find "$WORK/build" -name llama-speculative-simple -type f -perm -u+x | head -1)
    phase build ok $(( $(date +%s) - t )) "{\"cuda_arch\": \"sm_90\", \"jobs\": $(nproc)}"
    log "build done in $(( $(date +%s) - t )) s"
fi
export EDGE_EAGLE_UPSTREAM_BIN="${BIN:-/nonexistent}"
export HF_HUB_OFFLINE=1
"$PY" -c "import llama_cpp, edge_eagle; print('llama_cpp', llama_cpp.__file__)" >> "$LOG" 2>&1 \
    || { log "edge_eagle or llama_cpp does not import (see run.log)"; exit 1; }

# --- bench ------------------------------------------------------------------------------
t=$(date +%s)
EE=("$PY" -m edge_eagle.cli)
if [ $DRY = 1 ]; then
    BENCH=(--limit 2 -n 16 --k 1 2 --tree 3 --gpu-layers 0)
else
    BENCH=(--every 4 --limit 20 -n 96 --k 1 2 3 4 5 --tree 7 15 --gpu-layers -1)
fi
if [ "$(left)" -gt 150 ] || [ $DRY = 1 ]; then
    "${EE[@]}" bench --target "$GGUF" --drafter "$REPO/models/smollm2-135m-instruct-eagle3.1.q8_0.gguf" \
        --prompts "$DEV/part1/mtbench.jsonl" "${BENCH[@]}" --no-memory --quiet --out "$WORK/bench" \
        --json "$OUT/bench.json" > "$OUT/bench.md" 2>> "$LOG" \
        && phase bench ok $(( $(date +%s) - t )) || { phase bench failed $(( $(date +%s) - t )); log "bench failed"; }
    log "bench done"
else
    phase bench skipped 0 "{\"left_s\": $(left)}"
fi

# --- host overhead ----------------------------------------------------------------------
# scripts/bench_overhead.py on the GPU: the loop's host time per cycle, native fast path against
# the Python path (interleaved), where llama.cpp's kernels no longer evict the host's caches
t=$(date +%s)
if [ $DRY = 1 ]; then
    OVER=(--rounds 1 -n 12 --k 1 5 --gpu-layers 0)
else
    OVER=(--rounds 3 -n 48 --k 1 3 5 --gpu-layers -1)
fi
if [ "$(left)" -gt 240 ] || [ $DRY = 1 ]; then
    if "$PY" "$REPO/scripts/bench_overhead.py" --target "$GGUF" "${OVER[@]}" --fastpath both --json \
            > "$WORK/overhead.json" 2>> "$LOG"; then
        SUMMARY=$("$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(json.dumps({
            "us_per_cycle": d["overhead_us_per_cycle"], "python_path_us": d["python_path"]["overhead_us_per_cycle"],
            "cycle_ms": {k: v["cycle_ms"]["median"] for k, v in d["per_k"].items()}}))' "$WORK/overhead.json")
        phase overhead ok $(( $(date +%s) - t )) "$SUMMARY"
    else
        phase overhead failed $(( $(date +%s) - t )); log "overhead bench failed"
    fi
    log "overhead done"
else
    phase overhead skipped 0 "{\"left_s\": $(left)}"
fi

# --- train ------------------------------------------------------------------------------
t=$(date +%s)
LEFT=$(left)
if [ $DRY = 1 ]; then
    TOKENS=600; STEPS=2; DEVICE=cpu; NGL=0; EXTRA=(--max-new 24 --parallel 2 --batch-rows 128 --draft-vocab 512)
else
    # ~4k tokens/s of extraction and ~2 steps/s on the H200 (estimates): a third of what is left extracts
    TOKENS=$(( (LEFT - 90) * 4000 / 3 )); STEPS=$(( (LEFT - 90) * 2 / 3 )); DEVICE=cuda; NGL=-1
    EXTRA=(--max-new 256 --parallel 16 --batch-rows 2048 --draft-vocab 8192)
fi
if [ "$LEFT" -gt 150 ] || [ $DRY = 1 ]; then
    "${EE[@]}" train --target "$GGUF" --data "$WORK/sharegpt-slice.jsonl" --regenerate --turns all \
        --features "$WORK/features" --out "$WORK/train" --max-tokens "$TOKENS" --steps "$STEPS" --ttt 5 --lr 3e-3 \
        --init warm --eval-every 0 --device "$DEVICE" --gpu-layers "$NGL" "${EXTRA[@]}" \
        --gguf "$OUT/drafter-gpu.q8_0.gguf" --outtype q8_0 --json > "$OUT/train.json" 2>> "$LOG" \
        && phase train ok $(( $(date +%s) - t )) "{\"tokens\": $TOKENS, \"steps\": $STEPS}" \
        || { phase train failed $(( $(date +%s) - t )); log "train failed"; }
    if [ -f "$OUT/drafter-gpu.q8_0.gguf" ]; then
        "${EE[@]}" bench --target "$GGUF" --drafter "$OUT/drafter-gpu.q8_0.gguf" --prompts "$DEV/part1/mtbench.jsonl" \
            "${BENCH[@]}" --no-auto --no-upstream --prompt-lookup-k 0 --no-memory --quiet --out "$WORK/eval" \
            --json "$OUT/eval.json" > /dev/null 2>> "$LOG" || log "eval failed"
    fi
else
    phase train skipped 0 "{\"left_s\": $LEFT}"
fi

{
    echo "# edge-eagle on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo 'this machine (no GPU)')"
    echo; echo "phases: $(cat "$PHASES" | tr -d '\n')"; echo
    cat "$OUT/bench.md" 2>/dev/null || true
} > "$OUT/report.md"
log "done in $(( $(date +%s) - T0 )) s"
