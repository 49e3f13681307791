#!/usr/bin/env bash
# One call on the GPU machine: the CUDA tests of TESTS (a gtest filter), then one `lily bench` process that runs
# the 35B-A3B synth (FORMAT, default affine4) once per --cuda-opt set of SETS (';'-separated, each a
# space-separated list of name=value; an empty set is the defaults, so ';a=1;' measures defaults, a=1, and the
# defaults again for drift), with VERIFY tentative steps and STREAMS concurrent 4K streams; with PROFILE_STREAMS
# also an Nsight Compute table of one step of that many streams (defaults plus PROFILE_OPTS). Needs the bundle
# of scripts/device/bundle.sh (carry .devbin). Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-switch-ab}
. scripts/device/env.sh
device_need lily test_cuda
cat "$OUT/gpu.txt"
if [ -n "${TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-200}" "$D/test_cuda" --gtest_filter="$TESTS" > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"
  grep -E "Failure|Expected|Which is|\[  FAILED|^\[  PASSED|tests? from .* ran" "$OUT/tests.log" | head -40
fi
timeout "${BENCH_TIMEOUT:-330}" "$D/lily" bench --backend cuda --synth qwen3.5-35b-a3b --format "${FORMAT:-affine4}" \
  --prefill 16 --decode-context 4096 --repeats 2 --decode-tokens 32 --verify "${VERIFY:-2,3,4,8}" \
  --streams "${STREAMS:-1,2,4,8,16}" --stream-context 4096 --cuda-ab "${SETS:-;}" > "$OUT/ab.txt" 2>&1
echo "bench rc=$?"
grep -vE "^bench:" "$OUT/ab.txt" | grep -E "^\S|decode|verify|streams|ratio" | head -150
if [ -n "${PROFILE_STREAMS:-}" ]; then
  popts=()
  for kv in ${PROFILE_OPTS:-}; do popts+=(--cuda-opt "$kv"); done
  OUT="$OUT/profile" PREFILL=16 CTX=256 TOP=${TOP:-30} \
    EXTRA="--streams $PROFILE_STREAMS --stream-context 1024 ${popts[*]}" timeout "${PROFILE_TIMEOUT:-150}" scripts/device/profile.sh
fi
