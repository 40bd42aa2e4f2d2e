#!/usr/bin/env bash
# How models/smollm2-135m-instruct-eagle3.1.q8_0.gguf was made (2-core CPU, see MODEL_CARD.md).
# Run from the repository root with the venv active (make install). Every step resumes.
set -euo pipefail
TARGET=$(python -c 'from edge_eagle.defaults import default_target; print(default_target())')
FEAT=${FEAT:-$HOME/.cache/edge-eagle/features/smollm2-sharegpt-regen-all-v2}
WORK=${WORK:-.cache/train-smollm2-v2}
STEPS=${STEPS:-240}
DATA=(--target "$TARGET" --data sharegpt --regenerate --turns all --features "$FEAT" --max-prompt 384 --max-new 256)

# 1. features: the target's own greedy answers to every ShareGPT turn, 16 at a time (resumable)
edge-eagle train "${DATA[@]}" --parallel 16 --max-tokens 360000 --steps 0 --out "$WORK/extract-only"

# 2. the ladder: short rungs at one budget (60 steps), two at a time, into a table
models/ladder.sh "$FEAT" "$WORK/ladder" 60 > "$WORK/ladder.md"

# 3. the final recipe, EAGLE-3.1 (shipped) and its EAGLE-3 ablation in parallel, one thread each
COMMON=("${DATA[@]}" --max-tokens 1 --draft-vocab 8192 --steps "$STEPS" --ttt 5 --lr "${LR:-3e-3}" --batch-rows 2048
        --threads 1 --seed 0 --init "${INIT:-warm}" --eval-every 40)
edge-eagle train "${COMMON[@]}" --norms eagle3.1 --out "$WORK/eagle3.1" \
    --gguf models/smollm2-135m-instruct-eagle3.1.q8_0.gguf --outtype q8_0 > "$WORK/eagle3.1.log" 2>&1 &
edge-eagle train "${COMMON[@]}" --norms eagle3 --out "$WORK/eagle3" \
    --gguf "$WORK/smollm2-135m-instruct-eagle3.q8_0.gguf" --outtype q8_0 > "$WORK/eagle3.log" 2>&1 &
wait

# 4. evaluation on MT-bench first turns (not in the training data), greedy
python scripts/eval_drafter.py --drafter models/smollm2-135m-instruct-eagle3.1.q8_0.gguf \
    --drafter "$WORK/smollm2-135m-instruct-eagle3.q8_0.gguf" --k 5 --every 2 -n 96 --json "$WORK/eval.json"
