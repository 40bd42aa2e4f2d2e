#!/usr/bin/env bash
# How models/smollm2-135m-instruct-eagle3.1.q8_0.gguf was made (2-core CPU, see MODEL_CARD.md).
# Run from the repository root with the venv active (make install).
set -euo pipefail
TARGET=$(python -c 'from edge_eagle.defaults import default_target; print(default_target())')
WORK=.cache/train-smollm2
COMMON=(--target "$TARGET" --data sharegpt --regenerate --features "$WORK/features"
        --max-tokens 220000 --max-prompt 384 --max-new 256 --draft-vocab 8192
        --steps "${STEPS:-200}" --ttt 5 --lr 1.5e-3 --batch-rows 2048 --threads 1 --seed 0)

# 1. features: the target's own greedy answers to ShareGPT first turns (resumable)
edge-eagle train "${COMMON[@]}" --out "$WORK/extract-only" --steps 0

# 2. the two ablation arms in parallel, same data / steps / seed, one thread each
edge-eagle train "${COMMON[@]}" --norms eagle3.1 --out "$WORK/eagle3.1" \
    --gguf models/smollm2-135m-instruct-eagle3.1.q8_0.gguf --outtype q8_0 > "$WORK/eagle3.1.log" 2>&1 &
edge-eagle train "${COMMON[@]}" --norms eagle3 --out "$WORK/eagle3" \
    --gguf "$WORK/smollm2-135m-instruct-eagle3.q8_0.gguf" --outtype q8_0 > "$WORK/eagle3.log" 2>&1 &
wait

# 3. evaluation on MT-bench first turns (not in the training data), greedy, k = 3, 5, 7
python scripts/eval_drafter.py --drafter models/smollm2-135m-instruct-eagle3.1.q8_0.gguf \
    --drafter "$WORK/smollm2-135m-instruct-eagle3.q8_0.gguf" --k 3 5 7 -n 128 --json "$WORK/eval.json"
