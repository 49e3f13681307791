#!/usr/bin/env bash
# One call on the GPU machine for the decode step kernel (issue 17, backend/cuda/mk.h): its tests
# (LILY_TEST_FILTER, default CudaMk.*), the op list of one step (`lily inspect`), then `lily bench` decode
# with the kernel off and on in the same call (CONFIGS, ';'-separated --cuda-opt sets, default "mk=0;mk=1")
# for each of MODELS (';'-separated "preset format" pairs). Needs the bundle of scripts/device/bundle.sh
# (carry .devbin). Logs under $OUT; the bench lines last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-mk}
. scripts/device/env.sh
device_need lily test_cuda
LILY=$D/lily
S0=$(date +%s)
if [ "${LILY_TEST_FILTER:-CudaMk.*}" != "-" ]; then
  timeout "${TEST_TIMEOUT:-240}" "$D/test_cuda" --gtest_filter="${LILY_TEST_FILTER:-CudaMk.*}" > "$OUT/tests.log" 2>&1
  echo "tests rc=$? ($(( $(date +%s) - S0 )) s)"
  grep -E "Failure|Expected|Which is|error|\[  FAILED|^\[  PASSED|^\[       OK|tests? from .* ran|^\[.*\] ctx" "$OUT/tests.log" | head -80
fi
timeout 120 "$LILY" inspect --synth qwen3.5-35b-a3b --format affine4 --backend cuda --context 4096 --cuda-opt mk=1 \
  > "$OUT/inspect-mk.txt" 2>&1
echo "inspect rc=$? ($(( $(date +%s) - S0 )) s): $(grep -c '^op ' "$OUT/inspect-mk.txt") ops"
IFS=';' read -ra MOD <<< "${MODELS:-qwen3.5-35b-a3b affine4}"
IFS=';' read -ra CFG <<< "${CONFIGS:-mk=0;mk=1}"
i=0
for m in "${MOD[@]}"; do
  read -r preset format <<< "$m"
  for c in "${CFG[@]}"; do
    i=$((i + 1))
    args=()
    [ "$c" != "-" ] && for kv in $c; do args+=(--cuda-opt "$kv"); done
    timeout "${BENCH_TIMEOUT:-200}" "$LILY" bench --synth "$preset" --format "$format" --backend cuda "${args[@]}" \
      --prefill 256 --decode-context "${DECODE:-256,4096,32768}" --repeats 2 --decode-tokens 64 > "$OUT/bench-$i.txt" 2>&1
    echo "=== $preset $format, $c (rc $?, $(( $(date +%s) - S0 )) s)"
    grep -E "^(prefill|decode) |error" "$OUT/bench-$i.txt" || tail -5 "$OUT/bench-$i.txt"
  done
done
