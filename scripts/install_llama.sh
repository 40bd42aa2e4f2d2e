#!/usr/bin/env bash
# Install llama-cpp-python 0.3.36 into $PYTHON's environment from a wheel built on this processor.
#
# llama.cpp compiles for the processor it is built on (GGML_NATIVE), and pip's wheel cache does
# not know which one that was: on a machine that moved to another processor generation a cached
# wheel stops with "Illegal instruction". So the wheel is built once per processor (the key from
# edge_eagle/cpu_key.py, and a hash of CMAKE_ARGS if set) and kept in
# ${EDGE_EAGLE_CACHE:-~/.cache/edge-eagle}/wheels/. The first build takes 6-13 minutes on 2 cores.
set -euo pipefail
VERSION=0.3.36
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${EDGE_EAGLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edge-eagle}
KEY=$("$PY" "$HERE/../edge_eagle/cpu_key.py")  # with a hash of CMAKE_ARGS when set
DIR="$CACHE/wheels/llama-cpp-python-$VERSION-$KEY"
find_wheel() { if [ -d "$DIR" ]; then find "$DIR" -maxdepth 1 -name "llama_cpp_python-$VERSION-*.whl" | head -1; fi; }
WHEEL=$(find_wheel)
if [ -z "$WHEEL" ]; then
    echo "building llama-cpp-python $VERSION for this processor (6-13 minutes on 2 cores) ..." >&2
    mkdir -p "$DIR"
    WORK=$(mktemp -d "$DIR/build.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    "$PY" -m pip wheel --quiet --no-deps --no-cache-dir --no-binary llama-cpp-python \
        "llama-cpp-python==$VERSION" -w "$WORK" \
        || { echo "building llama-cpp-python failed; install cmake and a C++ compiler, then rerun." >&2; exit 1; }
    mv "$WORK"/llama_cpp_python-"$VERSION"-*.whl "$DIR"/
    WHEEL=$(find_wheel)
fi
"$PY" -m pip install --quiet --no-deps --force-reinstall --no-cache-dir "$WHEEL"
