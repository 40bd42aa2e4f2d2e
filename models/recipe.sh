#!/usr/bin/env bash
# How models/smollm2-135m-instruct-eagle3.1.q8_0.gguf (version 3) was made (2-core CPU, see
# MODEL_CARD.md). Run from the repository root with the venv active (make install). Every step resumes.
set -euo pipefail
TARGET=$(python -c 'from edge_eagle.defaults import default_target; print(default_target())')
FEATURES=${FEATURES:-$HOME/.cache/edge-eagle/features}
REG=$FEATURES/smollm2-sharegpt-regen-all-v2     # the target's own answers to every ShareGPT turn (v2's data)
FIX=$FEATURES/smollm2-sharegpt-fixed-first-v3   # ShareGPT's own first answers, the target's soft labels
WORK=${WORK:-.cache/train-smollm2-v3}
mkdir -p "$WORK"

# 1. features (resumable): regenerated answers, 16 at a time; fixed text by prefill only
edge-eagle train --target "$TARGET" --data sharegpt --regenerate --turns all --features "$REG" --max-prompt 384 \
    --max-new 256 --parallel 16 --max-tokens 348051 --steps 0 --out "$WORK/extract-regen"
edge-eagle train --target "$TARGET" --data sharegpt --turns first --features "$FIX" --max-prompt 384 \
    --max-new 256 --max-tokens 360000 --steps 0 --out "$WORK/extract-fixed"

# 2. evaluation sets never trained on (MT-bench, unseen ShareGPT, HumanEval as chat, raw code)
python scripts/eval_sets.py build

# 3. the ladder: recipe rungs at 60 steps (v2), then the data rungs and the ablation at 240 steps
models/ladder.sh "$REG" "$WORK/ladder" 60 > "$WORK/ladder.md"
python scripts/eval_sets.py score "$WORK"/ladder/*/checkpoint --json > "$WORK/ladder-eval-sets.json"
models/data_rungs.sh "$REG" "$FIX" "$WORK/data" > "$WORK/data-rungs.txt"

# 4. the shipped drafter is the fixed-text rung (best on MT-bench, HumanEval and raw code)
cp "$WORK/data/fixed348k.gguf" models/smollm2-135m-instruct-eagle3.1.q8_0.gguf

# 5. measured through llama.cpp on MT-bench first turns (not in the training data), greedy
python scripts/eval_drafter.py --drafter models/smollm2-135m-instruct-eagle3.1.q8_0.gguf \
    --drafter "$WORK/data/fixed348k-eagle3.gguf" --k 5 --every 2 -n 96 --json "$WORK/eval.json"
