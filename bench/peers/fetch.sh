#!/usr/bin/env bash
# Fetches llama.cpp as node-llama-cpp 3.22.1 ships it: the prebuilt CPU libraries
# (@node-llama-cpp/linux-x64) and the matching source (git bundle inside node-llama-cpp), into
# $LILY_PEERS_DIR (default <repo>/.cache/llamacpp, git-ignored). Idempotent; prints the directory.
# Layout afterwards: $DIR/src (llama.cpp source clone), $DIR/libs (libllama*.so, libggml*.so).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DIR="${LILY_PEERS_DIR:-$ROOT/.cache/llamacpp}"
VER="${LLAMACPP_NPM_VERSION:-3.22.1}"
mkdir -p "$DIR"
# One fetch at a time (parallel ctest runs share the directory).
exec 9>"$DIR/.lock"
flock 9
if [[ ! -f "$DIR/src/include/llama.h" || ! -d "$DIR/libs" ]]; then
  command -v npm >/dev/null || { echo "fetch.sh: npm not found" >&2; exit 3; }
  tmp="$(mktemp -d "$DIR/tmp.XXXX")"
  trap 'rm -rf "$tmp"' EXIT
  ( cd "$tmp" && timeout 300 npm pack --silent --fetch-retries=1 --fetch-timeout=60000 "node-llama-cpp@$VER" "@node-llama-cpp/linux-x64@$VER" >/dev/null ) \
    || { echo "fetch.sh: npm pack failed (registry unreachable?)" >&2; exit 3; }
  mkdir -p "$tmp/nlc" "$tmp/x64"
  tar xzf "$tmp"/node-llama-cpp-"$VER".tgz -C "$tmp/nlc"
  tar xzf "$tmp"/node-llama-cpp-linux-x64-"$VER".tgz -C "$tmp/x64"
  rm -rf "$DIR/src" "$DIR/libs"
  git clone -q "$tmp/nlc/package/llama/gitRelease.bundle" "$DIR/src" 2>/dev/null
  cp -r "$tmp/x64/package/bins/linux-x64" "$DIR/libs"
  cp "$tmp/nlc/package/llama/gitRelease.bundle" "$DIR/gitRelease.bundle"
fi
echo "$DIR"
