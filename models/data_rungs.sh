#!/usr/bin/env bash
# The drafter ladder's data rungs (issue 15), at the final recipe's budget (240 steps), since
# 60-step rungs cannot tell data apart: every one of them lands within +-0.02 simulated tau of
# the others on the eval sets. Three runs side by side, one thread each:
#   fixed348k       ShareGPT's own first answers (fixed text, prefill only) with the target's soft
#                   labels, capped at the regenerated set's 348k feature tokens (equal tokens);
#   mix-all         the regenerated set (every turn, 348k) + the fixed-text set (all of it): more
#                   conversations, ~1 epoch in 240 steps instead of ~2.6;
#   fixed348k-eagle3  fixed348k with EAGLE-3 norms (the ablation at the final recipe, which is
#                   fixed348k's; it runs after the other two: three at once need ~22 GB of RAM).
# The regenerated arm at this budget is the v2 drafter itself (models/recipe.sh, step 3).
# Each run reports simulated acceptance on the eval sets (scripts/eval_sets.py) every 40 steps.
#   models/data_rungs.sh REGEN_FEATURES FIXED_FEATURES OUT_DIR
# Run from the repository root with the venv active, after `python scripts/eval_sets.py build`.
set -euo pipefail
REG=$1; FIX=$2; OUT=$3
E=${EVAL_DIR:-$HOME/.cache/edge-eagle/eval}
TARGET=$(python -c 'from edge_eagle.defaults import default_target; print(default_target())')
mkdir -p "$OUT"
COMMON=(--target "$TARGET" --max-tokens 1 --draft-vocab 8192 --steps "${STEPS:-240}" --ttt 5 --lr 3e-3 --batch-rows 2048
        --threads 1 --seed 0 --init warm --eval-every 40 --max-prompt 384 --max-new 256
        --eval-features mtbench="$E/mtbench" sharegpt-unseen="$E/sharegpt-unseen" humaneval="$E/humaneval"
        code-raw="$E/code-raw")
REGEN=(--data sharegpt --regenerate --turns all --features "$REG")
edge-eagle train "${COMMON[@]}" --data sharegpt --turns first --features "$FIX" --train-tokens 348051 \
    --out "$OUT/fixed348k" --gguf "$OUT/fixed348k.gguf" > "$OUT/fixed348k.log" 2>&1 &
edge-eagle train "${COMMON[@]}" "${REGEN[@]}" --also-features "$FIX" \
    --out "$OUT/mix-all" --gguf "$OUT/mix-all.gguf" > "$OUT/mix-all.log" 2>&1 &
wait
edge-eagle train "${COMMON[@]}" --data sharegpt --turns first --features "$FIX" --train-tokens 348051 --norms eagle3 \
    --out "$OUT/fixed348k-eagle3" --gguf "$OUT/fixed348k-eagle3.gguf" > "$OUT/fixed348k-eagle3.log" 2>&1
python scripts/eval_sets.py score "$OUT/fixed348k/checkpoint" "$OUT/mix-all/checkpoint" "$OUT/fixed348k-eagle3/checkpoint"
