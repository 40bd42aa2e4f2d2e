#!/usr/bin/env bash
# Build upstream llama.cpp's C++ speculative loop (llama-speculative-simple) from the very
# llama.cpp source that llama-cpp-python 0.3.36 vendors, for `edge-eagle bench`.
#
#   scripts/build_upstream.sh            # prints the binary's path; builds once, then cached
#   CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90" scripts/build_upstream.sh
#
# Cache: ${EDGE_EAGLE_CACHE:-~/.cache/edge-eagle}/llama.cpp-0.3.36-<processor key>[-<hash of CMAKE_ARGS>]/
# (llama.cpp compiles for the processor it is built on; the key is edge_eagle/cpu_key.py's).
# The sdist comes from PyPI (pip download), or from $LLAMA_CPP_PYTHON_SDIST if set.
set -euo pipefail
VERSION=0.3.36
CACHE=${EDGE_EAGLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edge-eagle}
PY=${PYTHON:-python3}
SUFFIX="-$("$PY" "$(cd "$(dirname "$0")" && pwd)/../edge_eagle/cpu_key.py")"  # with CMAKE_ARGS' hash
DIR="$CACHE/llama.cpp-$VERSION$SUFFIX"
BIN="$DIR/bin/llama-speculative-simple"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi

mkdir -p "$DIR"
WORK=$(mktemp -d "$DIR/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SDIST=${LLAMA_CPP_PYTHON_SDIST:-}
if [ -z "$SDIST" ]; then
    echo "downloading the llama-cpp-python $VERSION sdist ..." >&2
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK/dl" >&2
    SDIST=$(ls "$WORK"/dl/llama_cpp_python-$VERSION.tar.gz)
fi
tar -xzf "$SDIST" -C "$WORK" "llama_cpp_python-$VERSION/vendor/llama.cpp"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
echo "building llama-speculative-simple (a few minutes) ..." >&2
# shellcheck disable=SC2086
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=OFF ${CMAKE_ARGS:-} > "$WORK/cmake.log" 2>&1 \
    || { tail -30 "$WORK/cmake.log" >&2; echo "cmake failed; install cmake and a C++ compiler, then rerun." >&2; exit 1; }
cmake --build "$WORK/build" --target llama-speculative-simple -j "$(nproc)" > "$WORK/build.log" 2>&1 \
    || { tail -30 "$WORK/build.log" >&2; echo "the build failed; see the errors above." >&2; exit 1; }
mkdir -p "$DIR/bin"
cp "$WORK/build/bin/llama-speculative-simple" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$BIN"
