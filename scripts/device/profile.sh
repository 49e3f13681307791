#!/usr/bin/env bash
# Per-kernel GPU time of one prefill chunk and one decode step (Nsight Compute, clocks and caches left
# alone), from `lily bench` on an in-memory synth model. Needs the bundle of scripts/device/bundle.sh.
# Env: DEVBIN (.devbin), PRESET (qwen3.5-35b-a3b), FORMAT (affine4), PREFILL (2048), CTX (4096), EXTRA (more
# bench arguments, e.g. "--streams 16 --stream-context 1024 --cuda-opt gemv_rows=16": steps of other row counts).
# Output: $OUT/ncu-<format>.csv and the summary tables on stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-profile}
. scripts/device/env.sh
device_need lily
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || echo /usr/local/cuda/bin/ncu)
FMT=${FORMAT:-affine4}
"$NCU" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
  --log-file "$OUT/ncu-$FMT.csv" "$D/lily" bench --synth "${PRESET:-qwen3.5-35b-a3b}" --format "$FMT" --backend cuda \
  --prefill "${PREFILL:-2048}" --decode-context "${CTX:-4096}" --repeats 1 --decode-tokens 2 ${EXTRA:-} > "$OUT/bench-$FMT.log" 2>&1
echo "ncu rc=$?"
tail -5 "$OUT/bench-$FMT.log"
python3 scripts/device/ncu_summary.py "$OUT/ncu-$FMT.csv" --top ${TOP:-45}
