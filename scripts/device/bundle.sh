#!/usr/bin/env bash
# Packs what scripts/device/check.sh runs on the GPU machine, whose image has CUDA but not lily's C++
# dependencies: the test binary built here (build-cuda, -DLILY_NATIVE=OFF), the shared libraries it
# needs beyond glibc, and the -r golden model (../shared is not copied to the device).
# Usage: scripts/device/bundle.sh [build-dir]   then pass carry: [".devbin"] to the device call.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-cuda}
grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo '/.devbin/' >> .git/info/exclude
rm -rf .devbin && mkdir -p .devbin/lib .devbin/golden
cp "$BUILD/tests/test_cuda" .devbin/
[ -x "$BUILD/lily" ] && cp "$BUILD/lily" .devbin/
for lib in $(ldd .devbin/test_cuda .devbin/lily 2>/dev/null | awk '/=>/ {print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
    *) cp -L "$lib" .devbin/lib/ ;;
  esac
done
if [ -d ../shared/golden/qwen3_5_moe_text-r ]; then cp -r ../shared/golden/qwen3_5_moe_text-r .devbin/golden/; fi
du -sh .devbin
