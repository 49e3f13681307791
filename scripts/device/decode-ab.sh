#!/usr/bin/env bash
# One device call for decode work: the CUDA tests named by TESTS, `lily bench` decode (affine4 35B-A3B
# synth) under each CUDA option setting of AB (space-separated name=value, passed as --cuda-opt, e.g.
# "gemv_ring=1 gemv_ring=0"; names: lily bench --help),
# and with PROFILE=1 an Nsight Compute per-kernel table of one decode step (profile.sh's summary).
# Needs the bundle of scripts/device/bundle.sh (carry .devbin). Output under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-ab}
. scripts/device/env.sh
device_need lily
if [ -n "${TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-240}" "$D/test_cuda" --gtest_filter="$TESTS" > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"
  grep -E "Failure|Expected|Which is|actual|FAILED|error" "$OUT/tests.log" | head -${FAIL_LINES:-30}
  grep -E "^\[  (PASSED|FAILED) \]|tests? from .* ran" "$OUT/tests.log" | tail -3
fi
i=0
for ab in ${AB:-pdl=1}; do
  i=$((i + 1))
  timeout 200 "$D/lily" bench --cuda-opt "$ab" --synth qwen3.5-35b-a3b --format "${FORMAT:-affine4}" --backend cuda \
    --prefill "${PREFILL:-512}" --decode-context "${CTX:-256,4096}" --repeats 2 --decode-tokens 32 > "$OUT/ab$i.txt" 2>&1
  echo "== $ab (rc $?)"
  grep -E "^(prefill|decode@)" "$OUT/ab$i.txt"
done
if [ "${PROFILE:-0}" = 1 ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
  "$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu.csv" \
    "$D/lily" bench --synth qwen3.5-35b-a3b --format "${FORMAT:-affine4}" --backend cuda --prefill 256 \
    --decode-context 4096 --repeats 1 --decode-tokens 2 > "$OUT/ncu-bench.log" 2>&1
  echo "ncu rc=$?"
  python3 scripts/device/ncu_summary.py "$OUT/ncu.csv" --top ${TOP:-30} | sed -n '/T=1:/,$p'
fi
