#!/usr/bin/env bash
# Nsight Compute sections (throughput, occupancy, warp stall reasons, memory) of the multi-row products: the
# rows_kernel launches of one prefill chunk of ROWS tokens (the same kernels a decode step of ROWS streams or a
# verification of ROWS rows runs), SKIP launches in, COUNT of them. Needs the bundle of scripts/device/bundle.sh.
# Env: ROWS (16), SKIP (10), COUNT (12), FORMAT (affine4), KERNEL (regex, rows_kernel). Output: $OUT/rows-ncu-ROWS.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-rows-ncu}
. scripts/device/env.sh
device_need lily
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
R=${ROWS:-16}
STALLS=long_scoreboard,short_scoreboard,wait,math_pipe_throttle,mio_throttle,lg_throttle,barrier,not_selected,selected,dispatch_stall,no_instruction,tex_throttle,drain,membar,imc_miss,branch_resolving
M="dram__bytes_read.sum,lts__t_bytes.sum,l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum"
for st in ${STALLS//,/ }; do M="$M,smsp__average_warps_issue_stalled_${st}_per_issue_active.ratio"; done
run_ncu() {
  "$NCU" --clock-control none --kernel-name "regex:${KERNEL:-rows_kernel}" --launch-skip "${SKIP:-10}" \
    --launch-count "${COUNT:-12}" --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis "$@" \
    "$D/lily" bench --synth "${PRESET:-qwen3.5-35b-a3b}" --format "${FORMAT:-affine4}" --backend cuda --prefill "$R" \
    --decode-context 64 --repeats 1 --decode-tokens 2 > "$OUT/rows-ncu-$R.txt" 2>&1
}
run_ncu --metrics "$M"
rc=$?
# a metric this ncu does not know: the sections alone
if grep -q "Failed to find metric\|invalid metric" "$OUT/rows-ncu-$R.txt"; then run_ncu; rc=$?; fi
echo "ncu rc=$rc ($OUT/rows-ncu-$R.txt)"
# per launch: name, time, throughputs, occupancy, bytes by level, and the stall reasons above 0.3 cycles an issue
grep -E "rows_kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit Reg|Warp Cycles Per Issued|Compute \(SM\) Thr|dram__bytes_read|lts__t_bytes|l1tex__t_bytes|issue_stalled" "$OUT/rows-ncu-$R.txt" |
  awk '/issue_stalled/ { v = $NF; gsub(",", "", v); if (v + 0 < 0.3) next } { print }' | head -${LINES_OUT:-120}
