#!/usr/bin/env bash
# Issue 20's H200 call (dense Qwen3.5), one device call that ends within DEADLINE (330 s) of its start:
# 1. the CUDA tests that hold the dense model: moe() with the dense MLP against its reference (per-row
#    GEMVs, multi-row products, fused norm); the dense golden (qwen3_5_text-a-mtp) against the CPU
#    backend in bf16, affine 4/8 and EXL3 K4; the tiny-dense synth in every format; multi-sequence steps,
#    tentative + commit and the pipelined loop with the dense golden and tiny-dense among the models;
# 2. `lily bench` rows (bench-all.sh: bytes-roofline fraction, prompt FLOP rate) for the dense 0.8B and
#    4B synth shapes: prefill of 512 / 4K prompts, decode at 256 / 4K context, in the order of the bars
#    (0.8B bf16 first: its decode bar is >= 1,000 tok/s), EXL3 K4 MCG last; a row that no longer fits the
#    deadline is skipped and says so; 3. `lily inspect` of the 0.8B bf16 decode step (kernels per step).
# Runs the bundle of scripts/device/bundle.sh (carry .devbin). Env: DENSE_TESTS (gtest filter; "" skips
# the tests), TEST_TIMEOUT (150 s), ROWS ("preset:format ..."), PREFILL, CTX, REPEATS, DEADLINE.
# Logs under $OUT (/tmp/lily-dense); a short summary last.
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
export OUT=${OUT:-/tmp/lily-dense}
. scripts/device/env.sh
device_need test_cuda lily
DEADLINE=${DEADLINE:-330}
left() { echo $((DEADLINE - ($(date +%s) - T0))); }

F=${DENSE_TESTS-"CudaOps.Moe*:*qwen3_5_text_a_mtp*:CudaExl3.GoldenModelK4MatchesCpu:CudaExl3.TinySynthMatchesCpu:CudaSynth.*:CudaStep.*"}
TRC=skipped
if [ -n "$F" ]; then
  timeout "${TEST_TIMEOUT:-150}" "$D/test_cuda" --gtest_filter="$F" > "$OUT/tests-dense.log" 2>&1
  TRC=$?
fi
T1=$(date +%s)

for row in ${ROWS:-qwen3.5-0.8b:bf16 qwen3.5-0.8b:affine4 qwen3.5-4b:bf16 qwen3.5-4b:affine4 qwen3.5-0.8b:exl3 qwen3.5-4b:exl3}; do
  L=$(left)
  if [ "$L" -lt 25 ]; then echo "== ${row/:/ } skipped: ${L} s left of the deadline" >> "$OUT/bench-rows.txt"; continue; fi
  PRESETS=${row%%:*} FORMATS=${row#*:} INSPECT_FORMATS="" PREFILL=${PREFILL:-512,4096} CTX=${CTX:-256,4096} \
    REPEATS=${REPEATS:-3} BENCH_TIMEOUT=$((L < 90 ? L - 5 : 85)) DEVBIN=$D scripts/device/bench-all.sh >> "$OUT/bench-rows.txt" 2>&1
done
T2=$(date +%s)
L=$(left)
if [ "$L" -gt 15 ]; then
  timeout $((L - 5)) "$D/lily" inspect --synth qwen3.5-0.8b --format bf16 --context 4096 > "$OUT/inspect-0.8b-bf16.txt" 2>&1
fi

echo "=== dense CUDA tests (rc $TRC, $((T1 - T0)) s) ==="
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \] [A-Za-z]|^\[  SKIPPED \] [A-Za-z]|tests? from .* ran" "$OUT/tests-dense.log" 2>/dev/null | head -30
grep -E "Failure|Expected|Which is|error" "$OUT/tests-dense.log" 2>/dev/null | head -20
echo "=== per suite (passed / failed / skipped) ==="
awk '/^\[       OK \]/ {split($4, a, "."); ok[a[1]]++; seen[a[1]] = 1}
     /^\[  FAILED  \] [A-Za-z]/ && !/listed below/ && NF >= 4 {split($4, a, "."); if (!(($4) in f)) {f[$4] = 1; bad[a[1]]++; seen[a[1]] = 1}}
     /^\[  SKIPPED \] [A-Za-z]/ {split($4, a, "."); sk[a[1]]++; seen[a[1]] = 1}
     END {for (s in seen) printf "| %-40s | %3d | %3d | %3d |\n", s, ok[s], bad[s], sk[s]}' "$OUT/tests-dense.log" 2>/dev/null | sort
echo "=== bench rows ($((T2 - T1)) s) ==="
cat "$OUT/bench-rows.txt" 2>/dev/null
echo "=== inspect 0.8B bf16 decode step ==="
sed -n 1,4p "$OUT/inspect-0.8b-bf16.txt" 2>/dev/null
echo "=== summary ==="
cat "$OUT/gpu.txt"
echo "tests rc=$TRC ($((T1 - T0)) s)  bench $((T2 - T1)) s  total $(($(date +%s) - T0)) s  commit $(git rev-parse --short HEAD 2>/dev/null)"
