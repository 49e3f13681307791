#!/usr/bin/env bash
# One call on the GPU machine: CUDA tests (kernels vs CPU references, golden models) and the bf16
# timing of the Qwen3.5-35B-A3B shape. Runs the bundle from scripts/device/bundle.sh when present
# (the device image lacks lily's C++ dependencies), else configures and builds test_cuda with -j16.
# Logs go to $OUT (tests.log, bench.log, gpu.txt); a short table is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-check}
. scripts/device/env.sh
if [ -x "$D/test_cuda" ]; then
  BIN=$D/test_cuda
else
  cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_NATIVE=OFF > "$OUT/build.log" 2>&1 &&
    cmake --build build-dev --target test_cuda -j16 >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  BIN=build-dev/tests/test_cuda
fi
T0=$(date +%s)
timeout 220 "$BIN" --gtest_filter="${LILY_TEST_FILTER:-CudaOps.*:Golden/*:CudaModel.*}" > "$OUT/tests.log" 2>&1
TRC=$?
T1=$(date +%s)
BRC=skipped
if [ "${LILY_SKIP_BENCH:-0}" != 1 ]; then
  LILY_CUDA_BENCH=1 timeout 300 "$BIN" --gtest_filter='CudaBench.*' > "$OUT/bench.log" 2>&1
  BRC=$?
fi
T2=$(date +%s)
if [ -x "$D/lily" ]; then
  "$D/lily" inspect --model "$D/golden/qwen3_5_moe_text-r" --context 4096 > "$OUT/inspect.txt" 2>&1
fi
echo "=== failures / prints ==="
grep -E "Failure|Expected|Which is|actual|\[  FAILED|^\[.*\] (prompt|decode)|error" "$OUT/tests.log" | head -60
echo "=== bench ==="
grep -E "^\||bench:" "$OUT/bench.log" 2>/dev/null
tail -3 "$OUT/bench.log" 2>/dev/null
echo "=== inspect (-r model, first lines) ==="
head -14 "$OUT/inspect.txt" 2>/dev/null
echo "=== summary ==="
cat "$OUT/gpu.txt"
grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|tests? from .* ran" "$OUT/tests.log" | head -20
echo "tests rc=$TRC ($((T1 - T0)) s)  bench rc=$BRC ($((T2 - T1)) s)  commit $(git rev-parse --short HEAD 2>/dev/null)"
