#!/usr/bin/env bash
# `lily bench` tables on the GPU machine: synth models (default the issue-6 Qwen3.5-35B-A3B shape) in
# affine 4-bit, EXL3 K4 (MCG) and bf16 — prefill and decode at several lengths, peak memory, the fraction
# of the bytes roofline (tok/s over copy bandwidth / bytes per token) and, for the dense presets, the prompt
# FLOP rate — and the kernels per decode step (`lily inspect`). Needs the bundle of scripts/device/bundle.sh.
# Env: DEVBIN (.devbin), PRESETS (qwen3.5-35b-a3b), FORMATS ("affine4 exl3 bf16"), PREFILL (512,4096,16384),
#      CTX (256,4096,32768), REPEATS (2), INSPECT_FORMATS (affine4; "" for none), BENCH_TIMEOUT (300 s a bench).
#      Output: $OUT/bench-<format>.json and .txt ($OUT/bench-<preset>-<format>.* for other presets),
#      $OUT/inspect-*.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lily-bench}
. scripts/device/env.sh
device_need lily
for p in ${PRESETS:-qwen3.5-35b-a3b}; do
  pre=""
  [ "$p" != qwen3.5-35b-a3b ] && pre="$p-"
  for f in ${FORMATS:-affine4 exl3 bf16}; do
    extra=""
    [ "$f" = exl3 ] && extra="--bits 4 --codebook mcg"
    timeout "${BENCH_TIMEOUT:-300}" "$D/lily" bench --synth "$p" --format "$f" $extra --backend cuda --prefill "${PREFILL:-512,4096,16384}" \
      --decode-context "${CTX:-256,4096,32768}" --repeats "${REPEATS:-2}" --decode-tokens 32 --json \
      > "$OUT/bench-$pre$f.json" 2> "$OUT/bench-$pre$f.txt"
    echo "== $p $f (rc $?)"
    grep -v "synth: layer\|^bench:" "$OUT/bench-$pre$f.txt" | tail -3
    python3 - "$OUT/bench-$pre$f.json" "$p" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
# dense presets, prompt FLOP rate: per token 2 x the layers' matmul weights (the head runs for the last row
# only) + causal attention over n/2 keys on average (QK and PV, 2 x 2 x Hq x 256 each); the delta rule's
# chunk products are left out (a few percent)
shapes = {"qwen3.5-0.8b": (1024, 24, 8, 2, 16, 16, 3584), "qwen3.5-4b": (2560, 32, 16, 4, 16, 32, 9216)}
flop = None
if sys.argv[2] in shapes:
    H, L, hq, hkv, hk, hv, I = shapes[sys.argv[2]]
    gdn = H * (2 * hk * 128 + hv * 128) + 2 * H * hv * 128 + 2 * H * hv
    att = H * hq * 512 + 2 * H * hkv * 256 + hq * 256 * H
    N = (L - L // 4) * gdn + L // 4 * att + L * 3 * H * I
    flop = lambda n: 2 * N + L // 4 * 4 * hq * 256 * n / 2
print(f"peak {j.get('peak_memory_bytes', 0) / 2**30:.2f} GiB, copy bw {j.get('copy_bandwidth_bytes_per_s', 0) / 1e12:.2f} TB/s")
for k in ("prefill", "decode"):
    for r in j.get(k, []):
        n = r.get("tokens", r.get("context"))
        roof = r.get("roofline_tok_s", 0)
        tf = f"  {flop(n) * r['tok_s'] / 1e12:6.1f} TFLOP/s" if k == "prefill" and flop else ""
        print(f"{k:8s} {n:>6} {r['tok_s']:10.1f} tok/s  roof {roof:9.0f} ({100 * r['tok_s'] / roof if roof else 0:5.1f} %)"
              f"{tf}  runs {[round(x, 1) for x in r.get('runs', [])]}")
PY
  done
  for f in ${INSPECT_FORMATS-affine4}; do
    timeout 120 "$D/lily" inspect --synth "$p" --format "$f" --context 4096 > "$OUT/inspect-$pre$f.txt" 2>&1
    echo "== inspect $p $f"; sed -n 1,4p "$OUT/inspect-$pre$f.txt"
  done
done
