#!/usr/bin/env bash
# One call on the GPU machine for issue 19 (prompt GEMMs), about 2 minutes: the wgmma kernels' tests on their own
# first (GEMM tests with the weights dequantised in registers and in shared memory, and the model on wgmma against
# mma.sync; if they hang, everything after leaves the wgmma kernels out), then the other GEMM tests, the
# bf16 / fp16 CUDA-vs-CPU-emulation test and the EXL3 products' tests (every precision, rows of every magnitude,
# cluster-split rows, MoE slots and tiles); `lily bench --gemm` (TFLOP/s of every kernel and precision: mma.sync bf16 / fp16 / split,
# wgmma bf16 / fp16 with the weights dequantised or converted in registers and in shared memory, the input
# staging alone); prefill of the Qwen3.5-35B-A3B synth, affine 4-bit, 4K prompt, once per precision mode and kernel
# choice on one synth (`--cuda-ab`). A short table last. Needs the bundle of scripts/device/bundle.sh (carry
# .devbin); logs under $OUT. Env: AB (the --cuda-ab sets), FORMAT (affine4).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-gemm}
. scripts/device/env.sh
device_need test_cuda lily
B=$D/test_cuda
L=$D/lily
timeout 35 "$B" --gtest_filter='CudaGemmWgmma.*:*CudaWgmmaModel.*' > "$OUT/wgmma-tests.log" 2>&1
WRC=$?
timeout 45 "$B" --gtest_filter='CudaGemm.*:*CudaBf16Classes.*:*CudaGoldenBf16.*:CudaExl3.*-CudaExl3.GoldenModelK4MatchesCpu:CudaExl3.TinySynthMatchesCpu:CudaExl3.TimingPrint' \
  > "$OUT/tests.log" 2>&1
TRC=$?
# a failed wgmma test still leaves its kernels timed; a hang (timeout) leaves them out
HUNG=0
[ "$WRC" = 124 ] || [ "$WRC" = 137 ] && HUNG=1
WG=(--cuda-opt gemm_wgmma=1)
[ "$HUNG" = 0 ] || WG=(--cuda-opt gemm_wgmma=0)
timeout 30 "$L" bench --gemm --backend cuda "${WG[@]}" > "$OUT/gemm.txt" 2>&1
GRC=$?
AB=${AB:-"precision=high;precision=bf16 gemm_wgmma=0"}
[ "$HUNG" = 0 ] && AB="$AB;precision=bf16 gemm_wgmma=1;precision=fp16 gemm_wgmma=1"
timeout 90 "$L" bench --synth qwen3.5-35b-a3b --format "${FORMAT:-affine4}" --backend cuda --prefill 4096 --decode-context 0 \
  --repeats 2 --cuda-ab "$AB" > "$OUT/prefill.txt" 2> "$OUT/prefill.err"
PRC=$?
echo "=== wgmma tests (rc $WRC) ==="
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|outputs past|Which is|Failure|median \|" "$OUT/wgmma-tests.log" | head -30
echo "=== CudaGemm.* + CudaBf16Classes + CudaGoldenBf16 + CudaExl3 (rc $TRC) ==="
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|outputs past|median \|" "$OUT/tests.log" | head -40
grep -E "Failure|actual:|^(K |split |bf16 |fp16 )" "$OUT/tests.log" | head -12
echo "=== lily bench --gemm (rc $GRC) ==="
grep -E "^\|" "$OUT/gemm.txt"
echo "=== prefill 4096, 35B-A3B synth ${FORMAT:-affine4} (rc $PRC) ==="
awk '/^synth / { match($0, /\[[^]]*\]/); set = substr($0, RSTART, RLENGTH) } /^prefill/ { printf "| %s | %s tok/s |\n", set, $3 }' "$OUT/prefill.txt"
grep -iE "error|fail" "$OUT/prefill.err" | head -5
cat "$OUT/gpu.txt"
echo "commit $(git rev-parse --short HEAD 2>/dev/null)"
