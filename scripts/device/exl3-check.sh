#!/usr/bin/env bash
# One device call for EXL3 decode work (issue 17): the CUDA tests named by TESTS (default the EXL3 and step
# tests), `lily bench` EXL3 decode under each option set of AB (';'-separated, as --cuda-ab) on each synth of
# PRESETS, and with NCU=1 the per-kernel table of one 35B-A3B decode step (profile.sh) under each option set
# of PROFILE_AB (';'-separated) plus Nsight Compute sections (speed of light, occupancy, launch, warp states)
# of a few EXL3 GEMV launches (options NCU_EXTRA).
# Needs the bundle of scripts/device/bundle.sh (carry .devbin). Output under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-exl3}
. scripts/device/env.sh
device_need lily test_cuda
cat "$OUT/gpu.txt"
TESTS=${TESTS-CudaExl3.*:CudaStep.*}
if [ -n "$TESTS" ]; then
  timeout "${TEST_TIMEOUT:-300}" "$D/test_cuda" --gtest_filter="$TESTS" > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"
  grep -E "Failure|Expected|Which is|FAILED" "$OUT/tests.log" | head -30
  grep -E "^\[  (PASSED|FAILED) \]|tests? from .* ran" "$OUT/tests.log" | tail -3
fi
AB=${AB:-exl3_gemv_split=0;exl3_gemv_split=2}
for p in ${PRESETS:-qwen3.5-35b-a3b qwen3.5-0.8b qwen3.5-4b}; do
  timeout 300 "$D/lily" bench --synth "$p" --format exl3 --backend cuda --cuda-ab "$AB" --prefill "${PREFILL:-512}" \
    --decode-context "${CTX:-4096}" --repeats "${REPEATS:-3}" --decode-tokens 32 > "$OUT/bench-$p.txt" 2>&1
  echo "== $p (rc $?)"
  grep -E "^(==|prefill|decode@)|cuda-ab|opt" "$OUT/bench-$p.txt" | head -20
done
if [ "${NCU:-0}" = 1 ]; then
  NCUB=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
  "$NCUB" --clock-control none --cache-control none -k regex:exl3_gemv --launch-skip "${NCU_SKIP:-200}" \
    --launch-count "${NCU_COUNT:-8}" --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    "$D/lily" bench --synth qwen3.5-35b-a3b --format exl3 --backend cuda --prefill 256 --decode-context 512 \
    --repeats 1 --decode-tokens 4 ${NCU_EXTRA:-} > "$OUT/ncu-sections.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "exl3_gemv|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Memory Throughput|DRAM Throughput|Compute \(SM\)|Stall|Warp Cycles Per Issued|Grid Size|Block Size|Dynamic Shared|Cluster" \
    "$OUT/ncu-sections.txt" | head -${NCU_LINES:-160}
  IFS=';' read -ra PAB <<< "${PROFILE_AB:-exl3_gemv_split=2}"
  for ab in "${PAB[@]}"; do
    echo "== profile $ab"
    ex=""; for o in $ab; do ex="$ex --cuda-opt $o"; done
    OUT="$OUT/prof-$(echo "$ab" | tr ' =' '_-')" FORMAT=exl3 PREFILL=256 TOP=${TOP:-16} EXTRA="$ex" scripts/device/profile.sh | sed -n '/step T=1:/,$p'
  done
fi
