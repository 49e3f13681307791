#!/usr/bin/env bash
# Issue 20's H200 call, one device call of ~4-6 minutes: first the CUDA tests that hold the dense model
# (the dense golden against HF and the CPU backend in bf16, affine 4/8 and EXL3 K4; the tiny-dense synth in
# every format; multi-sequence steps, tentative + commit and the pipelined loop with the dense golden and
# tiny-dense among the models), then the `lily bench` rows of bench-all.sh for the dense Qwen3.5-0.8B and
# -4B synth shapes in affine 4-bit and bf16: prefill of 512 / 4K prompts and decode at 256 / 4K context,
# with the bytes-roofline fraction and the prompt FLOP rate, and the kernels of one decode step.
# Needs the bundle of scripts/device/bundle.sh (carry .devbin). Env: DENSE_TESTS (gtest filter; "" skips
# the tests), TEST_TIMEOUT (150 s), and bench-all.sh's PRESETS, FORMATS, PREFILL, CTX, REPEATS,
# INSPECT_FORMATS, BENCH_TIMEOUT (100 s per bench here). Logs under $OUT (/tmp/lily-bench).
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/lily-bench}
mkdir -p "$OUT"
D=${DEVBIN:-.devbin}
[ -f "$D/bundle.tgz" ] && tar -C "$D" -xzf "$D/bundle.tgz" && rm -f "$D/bundle.tgz"
export LD_LIBRARY_PATH="$PWD/$D/lib:${LD_LIBRARY_PATH:-}"
export LILY_GOLDEN_EXTRA="$PWD/tests/data/golden:$PWD/$D/golden"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
T0=$(date +%s)
F=${DENSE_TESTS-"*qwen3_5_text_a_mtp*:CudaExl3.GoldenModelK4MatchesCpu:CudaExl3.TinySynthMatchesCpu:CudaSynth.*:CudaStep.*"}
TRC=skipped
if [ -n "$F" ]; then
  timeout "${TEST_TIMEOUT:-150}" "$D/test_cuda" --gtest_filter="$F" > "$OUT/tests-dense.log" 2>&1
  TRC=$?
  echo "=== dense CUDA tests (rc $TRC, $(($(date +%s) - T0)) s) ==="
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \] [A-Za-z]|^\[  SKIPPED \] [A-Za-z]|tests? from .* ran" "$OUT/tests-dense.log" | head -30
  grep -E "Failure|Expected|Which is" "$OUT/tests-dense.log" | head -20
fi
T1=$(date +%s)
echo "=== bench ==="
PRESETS=${PRESETS:-"qwen3.5-0.8b qwen3.5-4b"} FORMATS=${FORMATS:-"affine4 bf16"} PREFILL=${PREFILL:-512,4096} \
  CTX=${CTX:-256,4096} REPEATS=${REPEATS:-3} INSPECT_FORMATS=${INSPECT_FORMATS:-"affine4 bf16"} \
  BENCH_TIMEOUT=${BENCH_TIMEOUT:-100} DEVBIN=$D "$(dirname "$0")/bench-all.sh"
echo "=== summary ==="
cat "$OUT/gpu.txt"
echo "tests rc=$TRC ($((T1 - T0)) s)  bench $(($(date +%s) - T1)) s  commit $(git rev-parse --short HEAD 2>/dev/null)"
