#!/usr/bin/env bash
# One call on the GPU machine for speculative decoding on CUDA (issue 16): the CUDA MTP and speculation
# tests (MTP logits vs the CPU and the goldens, draft chains, every weight format, the MTP cache through
# tentative steps + commit, greedy speculative output == plain greedy for depths 1..6 and auto with both
# drafters on the device and host paths, streams together), then `lily bench --spec mtp` for the issue's
# H200 bars on the Qwen3.5-35B-A3B synth shape, affine 4-bit, 4K context: the plain baseline, depths 1..6
# and auto at acceptance 0.86, 1.0, 0.5, 0.7, 0.95, the verification cost table k = 1..6 and auto's picks;
# then the Qwen3-Next-80B-A3B shape while the time budget lasts (NEXT=0 skips it).
# The synth models' MTP weights are random, so their own drafts are never accepted: the bench's oracle
# replaces each drafted token by the recorded greedy continuation with probability a (independently per
# position) and by another token otherwise; the MTP head and the verification run at their full cost.
# Runs the bundle of scripts/device/bundle.sh (carry .devbin). Logs under $OUT; a summary table last.
# Env: LILY_TEST_FILTER (CudaMtp.*:CudaSpec.*), ACC, DEPTHS, TOKENS (128), REPEATS (2), BUDGET (340 s).
set -uo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
OUT=${OUT:-/tmp/lily-spec}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
D=${DEVBIN:-.devbin}
[ -f "$D/bundle.tgz" ] && tar -C "$D" -xzf "$D/bundle.tgz" && rm -f "$D/bundle.tgz"  # packed by bundle.sh
if [ ! -x "$D/test_cuda" ] || [ ! -x "$D/lily" ]; then
  echo "no bundle in $D (make it with scripts/device/bundle.sh <cuda build dir> and carry $D)"
  exit 1
fi
export LD_LIBRARY_PATH="$PWD/$D/lib:${LD_LIBRARY_PATH:-}"
export LILY_GOLDEN_EXTRA="$PWD/tests/data/golden:$PWD/$D/golden"
BUDGET=${BUDGET:-340}
left() { echo $(( BUDGET - ($(date +%s) - START) )); }

timeout "${TEST_TIMEOUT:-120}" "$D/test_cuda" --gtest_filter="${LILY_TEST_FILTER:-CudaMtp.*:CudaSpec.*}" > "$OUT/tests.log" 2>&1
TRC=$?
T1=$(date +%s)

ACC=${ACC:-0.86,1.0,0.5,0.7,0.95}  # the first one also drives the cost table's runs
DEPTHS=${DEPTHS:-1,2,3,4,5,6,auto}
bench() {  # preset, timeout, output name
  timeout "$2" "$D/lily" bench --synth "$1" --format affine4 --backend cuda --prefill 256 --decode-context 4096 \
    --repeats "${REPEATS:-2}" --decode-tokens "${TOKENS:-128}" --stream-context 4096 --spec mtp --acceptance "$ACC" \
    --spec-depth "$DEPTHS" --json > "$OUT/$3.json" 2> "$OUT/$3.txt"
  echo "$3 rc=$? ($(( $(date +%s) - $4 )) s)" >> "$OUT/bench-rc.txt"
}
: > "$OUT/bench-rc.txt"
S=$(date +%s); bench qwen3.5-35b-a3b "$(( $(left) > 200 ? 200 : $(left) ))" spec-35b "$S"
if [ "${NEXT:-1}" = 1 ] && [ "$(left)" -gt 90 ]; then
  S=$(date +%s); bench qwen3-next-80b-a3b "$(left)" spec-next "$S"
else
  echo "spec-next skipped ($(left) s of the budget left)" >> "$OUT/bench-rc.txt"
fi

echo "=== failures ==="
grep -E "Failure|Expected|Which is|actual|\[  FAILED|error" "$OUT/tests.log" | head -40
echo "=== per suite (passed / failed / skipped) ==="
awk '/^\[       OK \]/ {split($4, a, "."); ok[a[1]]++; seen[a[1]] = 1}
     /^\[  FAILED  \] [A-Za-z]/ && !/listed below/ && NF >= 4 {split($4, a, "."); if (!(($4) in f)) {f[$4] = 1; bad[a[1]]++; seen[a[1]] = 1}}
     /^\[  SKIPPED \] [A-Za-z]/ {split($4, a, "."); sk[a[1]]++; seen[a[1]] = 1}
     END {for (s in seen) printf "| %-30s | %3d | %3d | %3d |\n", s, ok[s], bad[s], sk[s]}' "$OUT/tests.log" | sort
echo "=== prints of the tests ==="
grep -E "^\[(qwen|bf16|affine|exl3|MTP|CudaSpec|stream)" "$OUT/tests.log" | head -40
for b in spec-35b spec-next; do
  [ -s "$OUT/$b.json" ] || { [ -f "$OUT/$b.txt" ] && { echo "=== $b: no JSON"; grep -v "synth: layer" "$OUT/$b.txt" | tail -5; }; continue; }
  echo "=== $b"
  python3 - "$OUT/$b.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s = j.get("spec") or {}
print(f"{j.get('model', '')}: plain decoding at {s.get('context')} context {s.get('plain_tok_s', 0):.1f} tok/s; "
      f"decode row(s) {[round(r['tok_s'], 1) for r in j.get('decode', [])]}; diverged runs {s.get('diverged_runs')}")
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
              f"{best['tok_s']:.1f}: {100 * au['tok_s'] / best['tok_s']:.1f}% ({'met' if ok else 'NOT met'}, needs >= 95%)")
PY
done
echo "=== summary ==="
cat "$OUT/gpu.txt"
grep -E "^\[  (PASSED|FAILED) \]|tests? from .* ran" "$OUT/tests.log" | tail -3
cat "$OUT/bench-rc.txt"
echo "tests rc=$TRC ($((T1 - START)) s), total $(( $(date +%s) - START )) s, commit $(git rev-parse --short HEAD 2>/dev/null)"
