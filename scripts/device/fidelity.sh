#!/usr/bin/env bash
# One call on the GPU machine: the fidelity table of issue 19 (scripts/device/fidelity.py) for every golden
# model — HF transformers bf16 (and float32) against the stored float32 reference, and lily's CUDA backend in
# the default (bf16) and the high (--precision high) prompt precision on the same 150 rows.
# Runs the bundle of scripts/device/bundle.sh (carry .devbin; it packs lily and the -r golden).
# Output: $OUT/fidelity.txt (the tables) and $OUT/fidelity.json. MODELS=a,b narrows the list; LILY_EXTRA adds
# lily options to every run (e.g. '--cuda-opt gemm_wgmma=0'); BF16_CLASSES='A;fp16:B' adds a run per class list
# (--precision bf16 --cuda-opt classes=A; with the prefix fp16: --precision fp16) and its table.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-fidelity}
. scripts/device/env.sh
LILY=${LILY:-$D/lily}
[ -x "$LILY" ] || { echo "error: no $LILY: run scripts/device/bundle.sh here and carry $D (or set LILY)"; exit 2; }
timeout "${FIDELITY_TIMEOUT:-500}" python3 scripts/device/fidelity.py --lily "$LILY" ${MODELS:+--models "$MODELS"} \
  ${LILY_EXTRA:+"--extra=$LILY_EXTRA"} ${BF16_CLASSES:+"--bf16-classes=$BF16_CLASSES"} \
  --json "$OUT/fidelity.json" > "$OUT/fidelity.txt" 2> "$OUT/fidelity.err"
RC=$?
cat "$OUT/fidelity.txt"
tail -5 "$OUT/fidelity.err"
echo "fidelity rc=$RC  commit $(git rev-parse --short HEAD 2>/dev/null)"
