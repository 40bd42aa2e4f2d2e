#!/usr/bin/env bash
# The drafter ladder (issue 15): short A/B runs at one fixed budget (same features, steps, seed),
# two at a time (one thread each). Each rung reports teacher-forced top-1 per TTT step and the
# simulated acceptance on the held-out slice (from its train summary), tau at k = 5 on a fixed
# 20-prompt MT-bench slice (every 4th first turn) and the drafter's step cost.
#   models/ladder.sh FEATURES_DIR OUT_DIR [STEPS [RUNG ...]]
# Rungs (default: all; a rung whose results are in OUT_DIR already is not run again):
#   baseline (trainer's default init, lr 1e-3, TTT 5, 8k draft vocabulary), warm (--init warm),
#   lr3e-3, vocab4k, ttt3, ttt7, frozen-head (--freeze-head), ffn768 (half the FFN width)
# Run from the repository root with the venv active (make install). Prints the table.
set -euo pipefail
FEAT=$1; OUT=$2; STEPS=${3:-60}; shift $(( $# < 3 ? $# : 3 ))
ALL=(baseline warm lr3e-3 vocab4k ttt3 ttt7 frozen-head ffn768)
if [ $# -gt 0 ]; then RUNGS=("$@"); else RUNGS=("${ALL[@]}"); fi
TARGET=$(python -c 'from edge_eagle.defaults import default_target; print(default_target())')
mkdir -p "$OUT"
COMMON=(--target "$TARGET" --data sharegpt --regenerate --turns all --features "$FEAT" --max-tokens 1
        --steps "$STEPS" --ttt 5 --batch-rows 2048 --threads 1 --seed 0 --eval-every "$STEPS" --json)
options() {
    case $1 in
        baseline) ;; warm) echo --init warm ;; lr3e-3) echo --lr 3e-3 ;; vocab4k) echo --draft-vocab 4096 ;;
        ttt3) echo --ttt 3 ;; ttt7) echo --ttt 7 ;; frozen-head) echo --freeze-head ;; ffn768) echo --ffn 768 ;;
        *) echo "unknown rung $1; use one of: ${ALL[*]}" >&2; exit 2 ;;
    esac
}
rung() {  # name: train (unless done), then evaluate (unless done)
    local name=$1
    if [ ! -s "$OUT/$name.json" ]; then
        # shellcheck disable=SC2046
        edge-eagle train "${COMMON[@]}" $(options "$name") --out "$OUT/$name" --gguf "$OUT/$name.gguf" \
            > "$OUT/$name.json" 2> "$OUT/$name.log"
    fi
}
todo=()
for name in "${RUNGS[@]}"; do options "$name" > /dev/null; [ -s "$OUT/$name.json" ] || todo+=("$name"); done
for ((i = 0; i < ${#todo[@]}; i += 2)); do  # two at a time, one core each
    rung "${todo[i]}" & a=$!
    if [ $((i + 1)) -lt ${#todo[@]} ]; then rung "${todo[i+1]}" & b=$!; wait $b; fi
    wait $a
done
for name in "${RUNGS[@]}"; do
    [ -s "$OUT/$name.eval.json" ] || python scripts/eval_drafter.py --drafter "$OUT/$name.gguf" --k 5 --every 4 \
        --limit 20 -n 96 --json "$OUT/$name.eval.json" > /dev/null 2>> "$OUT/eval.log"
done
python - "$OUT" "${RUNGS[@]}" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| rung | top-1 per TTT step | held-out sim. tau | MT-bench tau k=5 | acceptance by position | draft ms/token | train s |")
print("|---|---|---|---|---|---|---|")
for name in sys.argv[2:]:
    s = json.loads((out / f"{name}.json").read_text().strip().splitlines()[-1])
    e = json.loads((out / f"{name}.eval.json").read_text())[0]
    print(f"| {name} | {' '.join(f'{x:.2f}' for x in s['final_top1_per_step'])} | {s['heldout']['tau']:.3f} | "
          f"{e['tau']:.3f} | {' '.join(f'{x:.2f}' for x in e['per_position_acceptance'])} | "
          f"{e['draft_ms_per_token']:.2f} | {s['wall_time_s']:.0f} |")
PY
