#!/usr/bin/env bash
# Short confirmation for issue 19 after run 2 (about 60-80 s): the model-level tests of the bf16 / fp16 prompt
# GEMMs (CudaWgmmaModel: wgmma against mma.sync on each golden's bf16 weights and its affine 4-bit quantization, both
# modes; CudaBf16Classes: the device against its CPU emulation), then prefill at 4K of the Qwen3.5-35B-A3B synth,
# affine 4-bit, in the bf16 and fp16 modes with the default kernel choice (gemm_wgmma=auto: affine4 on wgmma).
# Needs the bundle of scripts/device/bundle.sh (carry .devbin); logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-gemm-confirm}
. scripts/device/env.sh
device_need test_cuda lily
timeout 35 "$D/test_cuda" --gtest_filter='*CudaWgmmaModel.*:*CudaBf16Classes.*' > "$OUT/tests.log" 2>&1
TRC=$?
timeout 50 "$D/lily" bench --synth qwen3.5-35b-a3b --format affine4 --backend cuda --prefill 4096 --decode-context 0 \
  --repeats 1 --cuda-ab 'precision=bf16;precision=fp16' > "$OUT/prefill.txt" 2> "$OUT/prefill.err"
PRC=$?
echo "=== CudaWgmmaModel + CudaBf16Classes (rc $TRC) ==="
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|median \||Failure|actual:" "$OUT/tests.log" | head -60
echo "=== prefill 4096, 35B-A3B synth affine4, gemm_wgmma=auto (rc $PRC) ==="
awk '/^synth / { match($0, /\[[^]]*\]/); set = substr($0, RSTART, RLENGTH) } /^prefill/ { printf "| %s | %s tok/s |\n", set, $3 }' "$OUT/prefill.txt"
grep -iE "error|fail" "$OUT/prefill.err" | head -5
cat "$OUT/gpu.txt"
