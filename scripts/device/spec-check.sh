#!/usr/bin/env bash
# One short call on the GPU machine for speculative decoding on CUDA (issue 16), within BUDGET (240 s) of wall
# time from its start, every stage under its own timeout:
# 1. the CUDA tests of the MTP step and speculation with the ones its changes touch (MTP logits vs the CPU
#    and the goldens, draft chains, every weight format, the MTP cache through tentative steps + commit,
#    greedy speculative output == plain greedy on the device and host paths, streams together; the bf16
#    golden bar, the multi-row products the verification steps run on); a pass/fail table at once;
# 2. one `lily bench --spec mtp` on the Qwen3.5-35B-A3B synth shape, affine 4-bit, 4K context (the synth is
#    built in memory in the same process, ~19 GB): the plain baseline, depths 1, 2, 3 and auto at acceptance
#    0.86, 1.0, 0.5, 0.7, 0.95, the verification cost table k = 1..6 and auto's picks. More PRESETS only while
#    NEED s of the budget are left.
# The synth models' MTP weights are random, so their own drafts are never accepted: the bench's oracle
# replaces each drafted token by the recorded greedy continuation with probability a (independently per
# position) and by another token otherwise; the MTP head and the verification run at their full cost.
# Runs the bundle of scripts/device/bundle.sh (carry it; DEVBIN names it, default .devbin). The goldens come
# from tests/data/golden of the tree (LILY_GOLDEN_EXTRA). Everything goes to stdout; logs under $OUT.
# Env: LILY_TEST_FILTER, SKIP_TESTS=1, TEST_TIMEOUT (100 s), PRESETS (qwen3.5-35b-a3b), ACC, DEPTHS (1,2,3,auto),
# TOKENS (64), REPEATS (2), BUDGET (240 s), NEED (150 s), SPEC_VOCAB (0: every id), OPTS (--cuda-opt name=value list).
set -uo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
OUT=${OUT:-/tmp/lily-spec}
BUDGET=${BUDGET:-240}
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
. scripts/device/env.sh
device_need test_cuda lily
echo "gpu: $(cat "$OUT/gpu.txt"); commit $(git rev-parse --short HEAD 2>/dev/null); budget $BUDGET s"

summary_tests() {
  grep -E "^\[  (PASSED|FAILED) \]|tests? from .* ran" "$OUT/tests.log" | tail -3
  echo "| suite                          |  ok | bad | skip |"
  # gtest lists a failed or skipped test twice (as it ends, and in the closing list): count each name once
  awk '/^\[       OK \]/ {split($4, a, "."); ok[a[1]]++; seen[a[1]] = 1}
       /^\[  FAILED  \] [A-Za-z]/ && !/listed below/ && NF >= 4 {split($4, a, "."); if (!(($4) in f)) {f[$4] = 1; bad[a[1]]++; seen[a[1]] = 1}}
       /^\[  SKIPPED \] [A-Za-z]/ && !/listed below/ && NF >= 4 {split($4, a, "."); if (!(($4) in k)) {k[$4] = 1; sk[a[1]]++; seen[a[1]] = 1}}
       END {for (s in seen) printf "| %-30s | %3d | %3d | %4d |\n", s, ok[s], bad[s], sk[s]}' "$OUT/tests.log" | sort
  grep -E "^\[  FAILED  \] [A-Za-z]" "$OUT/tests.log" | grep -v "listed below" | sort -u | head -20
}

# 1. tests (the parameterised golden suite is Golden/CudaGoldenBf16.*, hence the leading *)
TRC=skipped
: > "$OUT/tests.log"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  F=${LILY_TEST_FILTER:-"CudaMtp.*:CudaSpec.*:*CudaGoldenBf16.*:CudaRows.*"}
  echo "=== 1. test_cuda --gtest_filter='$F' (timeout ${TEST_TIMEOUT:-100} s)"
  timeout -k 5 "${TEST_TIMEOUT:-100}" "$D/test_cuda" --gtest_filter="$F" > "$OUT/tests.log" 2>&1
  TRC=$?
  [ "$TRC" = 124 ] || [ "$TRC" = 137 ] && echo "TIMED OUT; last test started: $(grep '^\[ RUN' "$OUT/tests.log" | tail -1)"
  echo "rc=$TRC ($(( $(date +%s) - START )) s)"
  summary_tests
  echo "--- failures"
  grep -E "Failure|Expected|Which is|actual|error" "$OUT/tests.log" | head -40
  echo "--- prints of the tests"
  grep -E "^\[(qwen|bf16|affine|exl3|MTP|CudaSpec|stream|Golden)" "$OUT/tests.log" | head -40
fi
T1=$(date +%s)

# 2. bench rows; each progress line stamped with the seconds since the bench started (the synth's share)
stamp() { while IFS= read -r l; do printf '%4d s  %s\n' $(( $(date +%s) - S )) "$l"; done; }
SB=""; command -v stdbuf > /dev/null && SB="stdbuf -oL"  # tr line-buffered into the stamps
ACC=${ACC:-0.86,1.0,0.5,0.7,0.95}  # the first one also drives the cost table's runs
DEPTHS=${DEPTHS:-1,2,3,auto}
CUDA_OPTS=""
for kv in ${OPTS:-}; do CUDA_OPTS="$CUDA_OPTS --cuda-opt $kv"; done
: > "$OUT/bench-rc.txt"
NAMES=""
first=1
for P in ${PRESETS:-qwen3.5-35b-a3b}; do
  N=spec-$P
  L=$(( $(left) - 10 ))  # 10 s for the summary
  if { [ $first = 0 ] && [ "$L" -lt "${NEED:-150}" ]; } || [ "$L" -lt 30 ]; then
    echo "$N skipped ($L s of the budget left; run it alone: SKIP_TESTS=1 PRESETS=$P)" | tee -a "$OUT/bench-rc.txt"
    continue
  fi
  first=0
  NAMES="$NAMES $N"
  echo "=== 2. lily bench --synth $P --format affine4 --backend cuda --spec mtp at 4K (timeout $L s)"
  S=$(date +%s)
  timeout -k 5 "$L" "$D/lily" bench --synth "$P" --format affine4 --backend cuda --prefill 256 --decode-context 4096 \
    --repeats "${REPEATS:-2}" --decode-tokens "${TOKENS:-64}" --stream-context 4096 --spec mtp --acceptance "$ACC" \
    --spec-depth "$DEPTHS" --spec-vocab "${SPEC_VOCAB:-0}" $CUDA_OPTS --json > "$OUT/$N.json" 2> >($SB tr '\r' '\n' | stamp > "$OUT/$N.txt")
  RC=$?
  sleep 1  # the stamping loop drains
  echo "$N rc=$RC ($(( $(date +%s) - S )) s)" | tee -a "$OUT/bench-rc.txt"
  # the progress lines (what came before a timeout, too), without most of the synth's layer counter
  grep -v -E "synth: layer [0-9]*[1-9]/" "$OUT/$N.txt"
done

for b in $NAMES; do
  [ -s "$OUT/$b.json" ] || { echo "=== $b: no JSON"; continue; }
  echo "=== $b"
  python3 - "$OUT/$b.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s = j.get("spec") or {}
print(f"{j.get('model', '')}: plain decoding at {s.get('context')} context {s.get('plain_tok_s', 0):.1f} tok/s; "
      f"decode row(s) {[round(r['tok_s'], 1) for r in j.get('decode', [])]}; repeated passes {s.get('rerecorded_passes')}, diverged runs {s.get('diverged_runs')}")
rows = s.get("rows", [])
print(f"{'accept':>7} {'depth':>5} {'tok/s':>8} {'speedup':>8} {'tok/round':>9} {'accepted':>8} {'drafts':>6}")
for r in rows:
    a = r["acceptance"]
    print(f"{a if a is not None else 'own':>7} {str(r['depth']):>5} {r['tok_s']:8.1f} {r['speedup']:7.2f}x "
          f"{r['tokens_per_round']:9.2f} {100 * r['accepted']:7.1f}% {r['mean_depth']:6.2f}")
print("round costs (ms): " + "; ".join(f"k {c['k']}: verify {c['verify_ms']:.3f} draft step {c['draft_step_ms']:.3f} "
                                       f"round {c['round_ms']:.3f}" for c in s.get("round_costs", [])))
print("auto picks from the costs: " + ", ".join(f"{p['acceptance']} -> {p['depth']}" for p in s.get("auto_picks", [])))
def row(a, d):
    return next((r for r in rows if r["acceptance"] is not None and abs(r["acceptance"] - a) < 1e-9 and r["depth"] == d), None)
for a, bar in ((0.86, 1.6), (1.0, 2.0)):
    r = row(a, 3)
    if r: print(f"bar: depth 3 at acceptance {a}: {r['speedup']:.2f}x (needs >= {bar}x): {'met' if r['speedup'] >= bar else 'NOT met'}")
for a in (0.5, 0.7, 0.86, 0.95):
    fixed = [r for r in rows if r["acceptance"] is not None and abs(r["acceptance"] - a) < 1e-9 and r["depth"] != "auto"]
    au = row(a, "auto")
    if fixed and au:
        best = max(fixed, key=lambda r: r["tok_s"])
        ok = au["tok_s"] >= 0.95 * best["tok_s"]
        print(f"bar: auto at {a}: {au['tok_s']:.1f} tok/s (mean depth {au['mean_depth']:.2f}) vs best fixed depth {best['depth']} "
              f"of those run {best['tok_s']:.1f}: {100 * au['tok_s'] / best['tok_s']:.1f}% ({'met' if ok else 'NOT met'}, needs >= 95%)")
PY
done
echo "=== summary"
cat "$OUT/gpu.txt"
[ "$TRC" != skipped ] && summary_tests
cat "$OUT/bench-rc.txt"
echo "tests rc=$TRC ($((T1 - START)) s), total $(( $(date +%s) - START )) s of $BUDGET, commit $(git rev-parse --short HEAD 2>/dev/null)"
