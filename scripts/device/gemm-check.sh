#!/usr/bin/env bash
# One call on the GPU machine for issue 19 (prompt GEMMs): the wgmma kernel's own tests first — if they fail
# or hang, every later run takes --cuda-opt gemm_wgmma=0 (the mma.sync kernel) so the call still measures —
# then the precision, golden and op tests, the fidelity table (scripts/device/fidelity.sh), `lily bench --gemm`
# (expert GEMMs at 4K-prompt routing per kernel, dense bf16 rate) and prefill of the 35B-A3B synth in affine4
# (wgmma on and off) and bf16. Needs the bundle of scripts/device/bundle.sh (carry .devbin). Logs under $OUT;
# a short summary last. BENCH=0 skips the model benches.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-gemm}
. scripts/device/env.sh
device_need test_cuda lily
B=$D/test_cuda
L=$D/lily
timeout 120 "$B" --gtest_filter='CudaGemmWgmma.*' > "$OUT/wgmma-tests.log" 2>&1
WRC=$?
OPT=()
[ "$WRC" = 0 ] || OPT=(--cuda-opt gemm_wgmma=0)
timeout 240 "$B" --gtest_filter="${LILY_TEST_FILTER:-CudaGemm.*:*Golden*:CudaOps.*:CudaExl3.*:CudaStep.*:CudaSynth.*:CudaModel.*}" \
  > "$OUT/tests.log" 2>&1
TRC=$?
OUT="$OUT/f" FIDELITY_TIMEOUT=150 LILY_EXTRA="${OPT[*]}" bash scripts/device/fidelity.sh > /dev/null 2>&1
timeout 90 "$L" bench --gemm --backend cuda > "$OUT/gemm.txt" 2>&1
GRC=$?
if [ "${BENCH:-1}" = 1 ]; then
  M="--synth qwen3.5-35b-a3b --backend cuda --decode-context 4096 --repeats 2 --decode-tokens 16"
  timeout 150 "$L" bench $M --format affine4 --prefill 4096,16384 "${OPT[@]}" > "$OUT/bench-affine4.txt" 2>&1
  timeout 110 "$L" bench $M --format affine4 --prefill 4096 --cuda-opt gemm_wgmma=0 > "$OUT/bench-affine4-mma.txt" 2>&1
  timeout 110 "$L" bench $M --format bf16 --prefill 4096 "${OPT[@]}" > "$OUT/bench-bf16.txt" 2>&1
fi
echo "=== wgmma tests (rc $WRC) ==="
grep -E "^\[  (PASSED|FAILED) |Failure|outputs past|Which is" "$OUT/wgmma-tests.log" | head -12
echo "=== tests (rc $TRC) ==="
grep -E "^\[  FAILED  \]|default precision|tests? from .* ran|PASSED" "$OUT/tests.log" | head -30
echo "=== fidelity ==="
cat "$OUT/f/fidelity.txt" 2>/dev/null
echo "=== lily bench --gemm (rc $GRC) ==="
cat "$OUT/gemm.txt"
echo "=== model benches (${OPT[*]:-wgmma on}) ==="
for f in "$OUT"/bench-*.txt; do [ -f "$f" ] && { echo "-- $(basename "$f")"; grep -E "^(prefill|decode@)|memory" "$f" | head -6; }; done
cat "$OUT/gpu.txt"
echo "commit $(git rev-parse --short HEAD 2>/dev/null)"
