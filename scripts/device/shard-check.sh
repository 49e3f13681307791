#!/usr/bin/env bash
# The one-GPU check of the model split over N ranks (issue 21, docs/multi-gpu.md): every rank's share run in
# turn on ONE GPU against the unsplit CUDA path. Builds nothing: runs the bundle of scripts/device/bundle.sh
# (carry .devbin; DEVBIN=<folder> for another). About a minute:
#   test_cuda CudaShard.*   the goldens at N = 2, 4; the 35B-A3B shape (4 of its layers) at N = 2, 4, 8 in affine4
#                           and 4 in EXL3; tiny-tp8 at 8; refusals before upload; the shapes-only synth drawn on
#                           the GPU
#   lily generate           a golden's greedy tokens with --devices 0,0,0,0 against the unsplit run
#   lily bench              the whole 35B-A3B shape drawn on the GPU, 2 ranks in turn (the bench path; not a speed)
#   lily bench              the 397B-A17B shape in affine4 on one GPU: refused before upload, bytes needed vs free
# Logs under $OUT; a short table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-shard}
. scripts/device/env.sh
device_need test_cuda lily
T0=$(date +%s)
timeout 150 "$D/test_cuda" --gtest_filter='CudaShard.*' > "$OUT/shard-tests.log" 2>&1
TRC=$?
G=tests/data/golden/qwen3_5_moe_text-a-mtp
IDS=5,17,101,33,250,7,9,81,5,17,101,33
timeout 60 "$D/lily" generate --backend cuda --model $G --tokens $IDS --max-tokens 24 --json > "$OUT/gen-1.json" 2> "$OUT/gen.err"
timeout 60 "$D/lily" generate --backend cuda --devices 0,0,0,0 --model $G --tokens $IDS --max-tokens 24 --json \
  > "$OUT/gen-4.json" 2>> "$OUT/gen.err"
GEN=$(python3 -c "
import json, sys
try:
    a, b = (json.load(open(f))['tokens'] for f in sys.argv[1:])
    print('identical (%d tokens)' % len(a) if a == b else 'differ: %s vs %s' % (a, b))
except Exception as e:
    print('no result (gen.err): %s' % e)" "$OUT/gen-1.json" "$OUT/gen-4.json")
timeout 120 "$D/lily" bench --synth qwen3.5-35b-a3b --format affine4 --backend cuda --devices 0,0 --prefill 256 \
  --decode-context 256 --decode-tokens 8 --repeats 1 > "$OUT/bench-2-in-turn.txt" 2>&1
BRC=$?
timeout 60 "$D/lily" bench --synth qwen3.5-397b-a17b --format affine4 --backend cuda --devices 1 --prefill 256 \
  --decode-context 256 > "$OUT/fit-397b.txt" 2>&1
FRC=$?
T1=$(date +%s)
echo "=== failures ==="
grep -E "Failure|Expected|Which is|\[  FAILED" "$OUT/shard-tests.log" | head -40
echo "=== the split against the unsplit CUDA path ==="
grep -E "ranks in turn|greedy 32|refusals" "$OUT/shard-tests.log"
echo "=== summary ==="
echo "| check | result |"
echo "|---|---|"
echo "| CudaShard.* (rc $TRC) | $(grep -cE '^\[       OK \]' "$OUT/shard-tests.log") passed, $(grep -cE '^\[  FAILED  \] [A-Z]' "$OUT/shard-tests.log") failed, $(grep -cE '^\[  SKIPPED \] [A-Z]' "$OUT/shard-tests.log") skipped |"
echo "| generate --devices 0,0,0,0 vs unsplit | $GEN |"
echo "| bench 35B-A3B shape, 2 ranks in turn (rc $BRC) | $(grep -E 'decode|prefill' "$OUT/bench-2-in-turn.txt" | head -2 | tr '\n' ' ') |"
echo "| 397B-A17B affine4 on one GPU (rc $FRC, want 2) | $(grep -o 'error: .*' "$OUT/fit-397b.txt" | head -1) |"
echo "| wall time | $((T1 - T0)) s |"
