#!/usr/bin/env bash
# One call on the GPU machine: the many-row step paths (issue 14). The CUDA tests of LILY_TEST_FILTER,
# then for each --cuda-opt set in CONFIGS (';'-separated, each a space-separated list of name=value, "-"
# for the defaults) `lily bench` with STREAMS concurrent 4K streams and VERIFY tentative steps on the
# 35B-A3B synth in FORMAT (affine4, or exl3); with SERVE_CLIENTS also step-check.sh's server run under SERVE_OPTS. Needs the
# bundle of scripts/device/bundle.sh (carry .devbin). Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-rows}
. scripts/device/env.sh
device_need lily
LILY=$D/lily
if [ -n "${LILY_TEST_FILTER:-}" ]; then
  timeout "${TEST_TIMEOUT:-200}" "$D/test_cuda" --gtest_filter="$LILY_TEST_FILTER" > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"
  grep -E "Failure|Expected|Which is|\[  FAILED|^\[  PASSED|tests? from .* ran" "$OUT/tests.log" | head -40
fi
M="--synth qwen3.5-35b-a3b --format ${FORMAT:-affine4}"  # FORMAT=exl3 (K4 MCG synth) for EXL3
i=0
IFS=';' read -ra CFG <<< "${CONFIGS:--}"
for c in "${CFG[@]}"; do
  i=$((i + 1))
  args=()
  [ "$c" != "-" ] && for kv in $c; do args+=(--cuda-opt "$kv"); done
  timeout "${BENCH_TIMEOUT:-150}" "$LILY" bench $M --backend cuda "${args[@]}" --prefill ${PREFILL:-256} --decode-context ${DECODE:-4096} \
    --repeats 2 --decode-tokens 64 --streams "${STREAMS:-1,4,8,16,32}" --stream-context 4096 --verify "${VERIFY:-2,4,8}" \
    > "$OUT/bench-$i.txt" 2>&1
  echo "=== config $i: $c (rc $?)"
  grep -E "^(prefill|decode|streams|verify) " "$OUT/bench-$i.txt" || tail -5 "$OUT/bench-$i.txt"
done
if [ -n "${SERVE_CLIENTS:-}" ]; then
  S=$(date +%s)
  "$LILY" synth --preset qwen3.5-35b-a3b --format affine4 --out /tmp/serve-model > "$OUT/serve.txt" 2>&1
  [ -f "$D/tokenizer.json" ] && cp "$D/tokenizer.json" /tmp/serve-model/
  echo "synth $(( $(date +%s) - S )) s"
  sargs=()
  for kv in ${SERVE_OPTS:-}; do sargs+=(--cuda-opt "$kv"); done
  "$LILY" serve --model /tmp/serve-model --backend cuda --parallel 16 --ctx-size 4096 --port 18080 "${sargs[@]}" >> "$OUT/serve.txt" 2>&1 &
  SP=$!
  for _ in $(seq 180); do python3 -c "import urllib.request;urllib.request.urlopen('http://127.0.0.1:18080/health')" 2>/dev/null && break; sleep 1; done
  echo "server up after $(( $(date +%s) - S )) s"
  timeout "${SERVE_TIMEOUT:-200}" python3 scripts/device/serve_clients.py --port 18080 --clients "$SERVE_CLIENTS" --prompt 3000 --tokens 128 \
    2>> "$OUT/serve.txt" | tee "$OUT/serve-clients.txt"
  kill $SP; wait $SP 2>/dev/null
  tail -5 "$OUT/serve.txt"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
