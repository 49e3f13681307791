#!/usr/bin/env bash
# One device call comparing two builds: the CUDA tests of the second bundle (TESTS, a gtest filter; empty
# skips them), then `lily bench` ARGS from each bundle in turn, ROUNDS times (A B A B ...), the decode and
# prefill lines of each. Make the bundles with DEVBIN=<folder> scripts/device/bundle.sh <build> and carry both.
# Env: A (.devbin-old), B (.devbin), ARGS (the bench arguments after --backend cuda), ROUNDS (2).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-bundle-ab}
A=${A:-.devbin-old}
B=${B:-.devbin}
for d in "$A" "$B"; do DEVBIN=$d; . scripts/device/env.sh; device_need lily; done
cat "$OUT/gpu.txt"
if [ -n "${TESTS-*}" ]; then
  timeout "${TEST_TIMEOUT:-330}" "$B/test_cuda" --gtest_filter="${TESTS-*}" > "$OUT/tests.log" 2>&1
  echo "tests ($B) rc=$?"
  grep -E "^\[  (PASSED|FAILED) \]|FAILED  \] [A-Z]|tests? from .* ran" "$OUT/tests.log" | tail -8
fi
ARGS=${ARGS:---synth qwen3.5-35b-a3b --format exl3 --prefill 512 --decode-context 4096 --repeats 2 --decode-tokens 32}
for r in $(seq "${ROUNDS:-2}"); do
  for d in "$A" "$B"; do
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-150}" "$d/lily" bench --backend cuda $ARGS > "$OUT/bench-${d#.}-$r.txt" 2>&1
    echo "$d round $r (rc $?): $(grep -E '^(prefill|decode@)' "$OUT/bench-${d#.}-$r.txt" | awk '{printf "%s %s %s; ", $1, $2, $3}')"
  done
done
