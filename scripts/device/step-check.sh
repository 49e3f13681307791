#!/usr/bin/env bash
# One call on the GPU machine for the multi-sequence step (issue 14): every CUDA test (kernels at awkward
# sizes, batched groups, sequences together vs alone, tentative + commit, the batched sampler, the
# pipelined loop, golden models), `lily inspect` of the decode step alone and of 4 sequences batched, and
# `lily bench` single-stream decode at 4K on the 35B-A3B affine4 synth (today 416 tok/s: must not regress).
# Runs the bundle of scripts/device/bundle.sh when present (carry .devbin), else builds test_cuda and lily
# with -j16. Logs under $OUT; a short table last. LILY_TEST_FILTER narrows the tests; SKIP_BENCH=1 skips
# the bench and inspect runs.
# STREAMS=1,2,4,8,16,32 and VERIFY=2,4,8 add the batched-stream and verification rows to the bench;
# SERVE_CLIENTS=1,16 serves a synth model (bundle tokenizer.json beside the binaries) to that many clients.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-step}
. scripts/device/env.sh
if [ -x "$D/test_cuda" ]; then
  BIN=$D/test_cuda
  LILY=$D/lily
else
  cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_NATIVE=OFF > "$OUT/build.log" 2>&1 &&
    cmake --build build-dev --target test_cuda lily -j16 >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  BIN=build-dev/tests/test_cuda
  LILY=build-dev/lily
fi
T0=$(date +%s)
timeout "${TEST_TIMEOUT:-480}" "$BIN" --gtest_filter="${LILY_TEST_FILTER:-*}" > "$OUT/tests.log" 2>&1
TRC=$?
T1=$(date +%s)
BRC=skipped
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -x "$LILY" ]; then
  M="--synth qwen3.5-35b-a3b --format affine4"
  timeout 200 "$LILY" inspect $M --context 4096 > "$OUT/inspect-1.txt" 2>&1
  timeout 200 "$LILY" inspect $M --context 4096 --rows 4 --groups 4 > "$OUT/inspect-4x1.txt" 2>&1
  timeout "${BENCH_TIMEOUT:-300}" "$LILY" bench $M --backend cuda --prefill 4096 --decode-context 256,4096 --repeats 2 \
    --decode-tokens 64 ${STREAMS:+--streams $STREAMS --stream-context 4096} ${VERIFY:+--verify $VERIFY} \
    > "$OUT/bench.txt" 2>&1
  BRC=$?
fi
SRC=skipped
if [ -n "${SERVE_CLIENTS:-}" ] && [ -x "$LILY" ]; then  # the server bar: N streaming clients vs one
  S=$(date +%s)
  "$LILY" synth --preset qwen3.5-35b-a3b --format affine4 --out /tmp/serve-model > "$OUT/serve.txt" 2>&1
  [ -f "$D/tokenizer.json" ] && cp "$D/tokenizer.json" /tmp/serve-model/
  echo "synth $(( $(date +%s) - S )) s" >> "$OUT/serve.txt"
  "$LILY" serve --model /tmp/serve-model --backend cuda --parallel 16 --ctx-size 4096 --port 18080 >> "$OUT/serve.txt" 2>&1 &
  SP=$!
  for _ in $(seq 120); do curl -sf http://127.0.0.1:18080/health > /dev/null 2>&1 && break; sleep 1; done
  timeout 300 python3 scripts/device/serve_clients.py --port 18080 --clients "$SERVE_CLIENTS" --prompt 3000 --tokens 128 \
    > "$OUT/serve-clients.txt" 2>> "$OUT/serve.txt"
  SRC=$?
  kill $SP; wait $SP 2>/dev/null
fi
T2=$(date +%s)
echo "=== failures ==="
grep -E "Failure|Expected|Which is|actual|\[  FAILED|error" "$OUT/tests.log" | head -60
echo "=== per suite (passed / failed / skipped) ==="
awk '/^\[       OK \]/ {split($4, a, "."); ok[a[1]]++; seen[a[1]] = 1}
     /^\[  FAILED  \] [A-Za-z]/ && !/listed below/ && NF >= 4 {split($4, a, "."); if (!(($4) in f)) {f[$4] = 1; bad[a[1]]++; seen[a[1]] = 1}}
     /^\[  SKIPPED \] [A-Za-z]/ {split($4, a, "."); sk[a[1]]++; seen[a[1]] = 1}
     END {for (s in seen) printf "| %-40s | %3d | %3d | %3d |\n", s, ok[s], bad[s], sk[s]}' "$OUT/tests.log" | sort
echo "=== prints of the step tests ==="
grep -E "^\[(qwen|tiny|V )" "$OUT/tests.log" | head -20
echo "=== inspect: kernels per decode step ==="
grep -E "^(step|kernels)" "$OUT/inspect-1.txt" "$OUT/inspect-4x1.txt" 2>/dev/null
echo "=== bench (decode must stay ~416 tok/s at 4K) ==="
grep -E "^(prefill|decode|streams|verify|  )" "$OUT/bench.txt" 2>/dev/null || tail -5 "$OUT/bench.txt" 2>/dev/null
echo "=== server clients ==="
cat "$OUT/serve-clients.txt" 2>/dev/null; tail -3 "$OUT/serve.txt" 2>/dev/null
echo "=== summary ==="
cat "$OUT/gpu.txt"
grep -E "^\[  (PASSED|FAILED) \]|tests? from .* ran" "$OUT/tests.log" | tail -3
echo "tests rc=$TRC ($((T1 - T0)) s)  serve rc=$SRC  bench rc=$BRC ($((T2 - T1)) s)  commit $(git rev-parse --short HEAD 2>/dev/null)"
