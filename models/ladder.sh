#!/usr/bin/env bash
# The drafter ladder (issue 15): short A/B runs at one fixed budget (same features, steps, seed),
# two at a time (one thread each). Each rung reports teacher-forced top-1 per TTT step and the
# simulated acceptance on the held-out slice (from its train summary), tau at k = 5 on a fixed
# 20-prompt MT-bench slice (every 4th first turn) and the drafter's step cost.
#   models/ladder.sh FEATURES_DIR OUT_DIR [STEPS]
# Run from the repository root with the venv active (make install).
set -euo pipefail
FEAT=$1; OUT=$2; STEPS=${3:-60}
TARGET=$(python -c 'from edge_eagle.defaults import default_target; print(default_target())')
mkdir -p "$OUT"
COMMON=(--target "$TARGET" --data sharegpt --regenerate --turns all --features "$FEAT" --max-tokens 1
        --steps "$STEPS" --ttt 5 --batch-rows 2048 --threads 1 --seed 0 --eval-every "$STEPS" --json)
rung() {  # name, extra train options...
    local name=$1; shift
    edge-eagle train "${COMMON[@]}" --out "$OUT/$name" --gguf "$OUT/$name.gguf" "$@" > "$OUT/$name.json" 2> "$OUT/$name.log"
}
pair() { rung "$1" ${2:+$2} & local a=$!; rung "$3" ${4:+$4} & local b=$!; wait $a $b; }
pair baseline "" warm "--init warm"
pair lr3e-3 "--lr 3e-3" vocab4k "--draft-vocab 4096"
for name in baseline warm lr3e-3 vocab4k; do
    python scripts/eval_drafter.py --drafter "$OUT/$name.gguf" --k 5 --every 4 --limit 20 -n 96 \
        --json "$OUT/$name.eval.json" > /dev/null 2>> "$OUT/eval.log"
done
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| rung | top-1 per TTT step | held-out sim. tau | MT-bench tau k=5 | acceptance by position | draft ms/token | train s |")
print("|---|---|---|---|---|---|---|")
for name in ("baseline", "warm", "lr3e-3", "vocab4k"):
    s = json.loads((out / f"{name}.json").read_text().strip().splitlines()[-1])
    e = json.loads((out / f"{name}.eval.json").read_text())[0]
    print(f"| {name} | {' '.join(f'{x:.2f}' for x in s['final_top1_per_step'])} | {s['heldout']['tau']:.3f} | "
          f"{e['tau']:.3f} | {' '.join(f'{x:.2f}' for x in e['per_position_acceptance'])} | "
          f"{e['draft_ms_per_token']:.2f} | {s['wall_time_s']:.0f} |")
PY
