#!/usr/bin/env bash
# The whole CUDA suite and the headline figures of one commit, in one call (~5-7 min): every test of test_cuda
# (TESTS: a gtest filter, default all), then `lily bench` on the Qwen3.5-35B-A3B synth in affine 4-bit, prefill and
# decode at 4K, once per precision mode (high, the default; bf16; fp16) on the same weights.
# Needs the bundle of scripts/device/bundle.sh (carry .devbin). Logs under $OUT; a short table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-main-check}
. scripts/device/env.sh
device_need test_cuda lily
T0=$(date +%s)
timeout "${TEST_TIMEOUT:-360}" "$D/test_cuda" --gtest_filter="${TESTS:-*}" > "$OUT/tests.log" 2>&1
TRC=$?
T1=$(date +%s)
timeout "${BENCH_TIMEOUT:-200}" "$D/lily" bench --synth qwen3.5-35b-a3b --format affine4 --backend cuda --prefill 4096 \
  --decode-context 4096 --repeats 2 --cuda-ab 'precision=high;precision=bf16;precision=fp16' > "$OUT/bench.txt" 2> "$OUT/bench.err"
BRC=$?
T2=$(date +%s)
echo "=== failures ==="
grep -E "Failure|Expected|Which is|actual|\[  FAILED" "$OUT/tests.log" | head -60
echo "=== summary ==="
echo "| check | result |"
echo "|---|---|"
echo "| test_cuda ${TESTS:-*} (rc $TRC, $((T1 - T0)) s) | $(grep -cE '^\[       OK \]' "$OUT/tests.log") passed, $(grep -cE '^\[  FAILED  \] [A-Z]' "$OUT/tests.log") failed, $(grep -cE '^\[  SKIPPED \] [A-Z]' "$OUT/tests.log") skipped; last: $(grep -E '^\[ RUN' "$OUT/tests.log" | tail -1) |"
awk -v rc="$BRC" -v t="$((T2 - T1))" '/^synth / { match($0, /\[[^]]*\]/); set = substr($0, RSTART, RLENGTH) }
  /^prefill |^decode@ / { printf "| bench %s %s %s (rc %s, %s s) | %s tok/s |\n", set, $1, $2, rc, t, $3 }' "$OUT/bench.txt"
grep -iE "error|fail" "$OUT/bench.err" | head -5
cat "$OUT/gpu.txt"
