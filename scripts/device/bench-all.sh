#!/usr/bin/env bash
# The issue-6 table on the GPU machine: `lily bench` of the Qwen3.5-35B-A3B synth model in affine 4-bit,
# EXL3 K4 (MCG) and bf16 (prefill and decode at several lengths, peak memory, roofline fractions) and the
# kernels per decode step (`lily inspect`). Needs the bundle of scripts/device/bundle.sh.
# Env: DEVBIN (.devbin), FORMATS ("affine4 exl3 bf16"), PREFILL (512,4096,16384), CTX (256,4096,32768),
#      REPEATS (2). Output: $OUT/bench-<format>.json and .txt, $OUT/inspect-<format>.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
D=${DEVBIN:-.devbin}
[ -f "$D/bundle.tgz" ] && tar -C "$D" -xzf "$D/bundle.tgz" && rm -f "$D/bundle.tgz"
OUT=${OUT:-/tmp/lily-bench}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$D/lib:${LD_LIBRARY_PATH:-}"
for f in ${FORMATS:-affine4 exl3 bf16}; do
  extra=""
  [ "$f" = exl3 ] && extra="--bits 4 --codebook mcg"
  timeout 300 "$D/lily" bench --synth qwen3.5-35b-a3b --format "$f" $extra --backend cuda --prefill "${PREFILL:-512,4096,16384}" \
    --decode-context "${CTX:-256,4096,32768}" --repeats "${REPEATS:-2}" --decode-tokens 32 --json \
    > "$OUT/bench-$f.json" 2> "$OUT/bench-$f.txt"
  echo "== $f (rc $?)"
  grep -v "synth: layer\|^bench:" "$OUT/bench-$f.txt" | tail -3
  python3 - "$OUT/bench-$f.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"peak {j.get('peak_memory_bytes', 0) / 2**30:.1f} GiB, copy bw {j.get('copy_bandwidth_bytes_per_s', 0) / 1e12:.2f} TB/s")
for k in ("prefill", "decode"):
    for r in j.get(k, []):
        n = r.get("tokens", r.get("context"))
        print(f"{k:8s} {n:>6} {r['tok_s']:10.1f} tok/s  roof {r.get('roofline_tok_s', 0):9.0f}  runs {[round(x, 1) for x in r.get('runs', [])]}")
PY
done
for f in ${INSPECT_FORMATS:-affine4}; do
  timeout 120 "$D/lily" inspect --synth qwen3.5-35b-a3b --format "$f" --context 4096 > "$OUT/inspect-$f.txt" 2>&1
  echo "== inspect $f"; sed -n 1,4p "$OUT/inspect-$f.txt"
done
