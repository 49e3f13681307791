#!/usr/bin/env bash
# One call on the GPU machine for issue 19 (prompt GEMMs), about 2 minutes: the wgmma kernel's tests on their own
# first (GEMM tests, and the model on it against mma.sync; if they fail or hang, everything after leaves the wgmma
# kernel out), then the other GEMM tests, the bf16 / fp16 CUDA-vs-CPU-emulation test and the EXL3 GEMM in every
# precision; `lily bench --gemm` (TFLOP/s of every kernel and precision: mma.sync bf16 / fp16 / split, wgmma bf16 /
# fp16, the wgmma kernel's input staging alone; the wgmma kernel in both unit orders); prefill of the
# Qwen3.5-35B-A3B synth, affine 4-bit, 4K prompt, once per precision mode on one synth (`--cuda-ab`). A short
# table last. Needs the bundle of scripts/device/bundle.sh (carry .devbin); logs under $OUT. Env: AB (the
# --cuda-ab sets), FORMAT (affine4).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-gemm}
. scripts/device/env.sh
device_need test_cuda lily
B=$D/test_cuda
L=$D/lily
timeout 40 "$B" --gtest_filter='CudaGemmWgmma.*:*CudaWgmmaModel.*' > "$OUT/wgmma-tests.log" 2>&1
WRC=$?
timeout 45 "$B" --gtest_filter='CudaGemm.*:*CudaBf16Classes.*:CudaExl3.LinearMatchesReference' > "$OUT/tests.log" 2>&1
TRC=$?
WG=()
[ "$WRC" = 0 ] && WG=(--cuda-opt gemm_wgmma=1)
timeout 30 "$L" bench --gemm --backend cuda "${WG[@]}" > "$OUT/gemm.txt" 2>&1
GRC=$?
if [ "$WRC" = 0 ]; then
  timeout 20 "$L" bench --gemm --backend cuda --cuda-opt gemm_wgmma=1 --cuda-opt wgmma_raster=1 > "$OUT/gemm-raster1.txt" 2>&1
fi
AB=${AB:-"precision=high;precision=bf16;precision=fp16"}
[ "$WRC" = 0 ] && AB="$AB;precision=bf16 gemm_wgmma=1;precision=fp16 gemm_wgmma=1"
timeout 90 "$L" bench --synth qwen3.5-35b-a3b --format "${FORMAT:-affine4}" --backend cuda --prefill 4096 --decode-context 0 \
  --repeats 2 --cuda-ab "$AB" > "$OUT/prefill.txt" 2> "$OUT/prefill.err"
PRC=$?
echo "=== wgmma tests (rc $WRC) ==="
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|outputs past|Which is|Failure|median \|" "$OUT/wgmma-tests.log" | head -24
echo "=== CudaGemm.* + CudaBf16Classes + CudaExl3.LinearMatchesReference (rc $TRC) ==="
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|outputs past|median \|" "$OUT/tests.log" | head -30
echo "=== lily bench --gemm (rc $GRC) ==="
grep -E "^\|" "$OUT/gemm.txt"
if [ -f "$OUT/gemm-raster1.txt" ]; then
  echo "=== wgmma_raster=1 (wgmma rows) ==="
  grep -E "^\| .*wgmma" "$OUT/gemm-raster1.txt"
fi
echo "=== prefill 4096, 35B-A3B synth ${FORMAT:-affine4} (rc $PRC) ==="
awk '/^synth / { match($0, /\[[^]]*\]/); set = substr($0, RSTART, RLENGTH) } /^prefill/ { printf "| %s | %s tok/s |\n", set, $3 }' "$OUT/prefill.txt"
grep -iE "error|fail" "$OUT/prefill.err" | head -5
cat "$OUT/gpu.txt"
echo "commit $(git rev-parse --short HEAD 2>/dev/null)"
