#!/usr/bin/env bash
# Issue 20's H200 rows: `lily bench` of the dense Qwen3.5-0.8B and -4B synth shapes in affine 4-bit and
# bf16, prefill of a 4K prompt and decode at 4K context (plus 512 / 256 for the shape of the curve), with
# the roofline fraction (tok/s over the bytes-per-token bound at the measured copy bandwidth), and the
# kernels of one decode step (`lily inspect`). Needs the bundle of scripts/device/bundle.sh.
# Env: DEVBIN (.devbin), PRESETS ("qwen3.5-0.8b qwen3.5-4b"), FORMATS ("affine4 bf16"), PREFILL (512,4096),
#      CTX (256,4096), REPEATS (3). Output: $OUT/bench-<preset>-<format>.json and .txt, $OUT/inspect-*.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
D=${DEVBIN:-.devbin}
[ -f "$D/bundle.tgz" ] && tar -C "$D" -xzf "$D/bundle.tgz" && rm -f "$D/bundle.tgz"
OUT=${OUT:-/tmp/lily-bench}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$D/lib:${LD_LIBRARY_PATH:-}"
for p in ${PRESETS:-qwen3.5-0.8b qwen3.5-4b}; do
  for f in ${FORMATS:-affine4 bf16}; do
    tag="$p-$f"
    timeout 300 "$D/lily" bench --synth "$p" --format "$f" --backend cuda --prefill "${PREFILL:-512,4096}" \
      --decode-context "${CTX:-256,4096}" --repeats "${REPEATS:-3}" --decode-tokens 64 --json \
      > "$OUT/bench-$tag.json" 2> "$OUT/bench-$tag.txt"
    echo "== $tag (rc $?)"
    grep -v "synth: layer\|^bench:" "$OUT/bench-$tag.txt" | tail -3
    python3 - "$OUT/bench-$tag.json" "$p" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
# matmul weights per token (head included, embedding gather not): prompt FLOP rate = 2 * N * tok/s
shapes = {"qwen3.5-0.8b": (1024, 24, 8, 2, 16, 16, 3584), "qwen3.5-4b": (2560, 32, 16, 4, 16, 32, 9216)}
H, L, hq, hkv, hk, hv, I = shapes[sys.argv[2]]
gdn = H * (2 * hk * 128 + hv * 128) + 2 * H * hv * 128 + 2 * H * hv
att = H * hq * 512 + 2 * H * hkv * 256 + hq * 256 * H
N = (L - L // 4) * gdn + L // 4 * att + L * 3 * H * I + 248320 * H
print(f"peak {j.get('peak_memory_bytes', 0) / 2**30:.2f} GiB, copy bw {j.get('copy_bandwidth_bytes_per_s', 0) / 1e12:.2f} TB/s")
for k in ("prefill", "decode"):
    for r in j.get(k, []):
        n = r.get("tokens", r.get("context"))
        roof = r.get("roofline_tok_s", 0)
        frac = r["tok_s"] / roof if roof else 0
        tf = f"  {2 * N * r['tok_s'] / 1e12:6.1f} TFLOP/s" if k == "prefill" else ""
        print(f"{k:8s} {n:>6} {r['tok_s']:10.1f} tok/s  roof {roof:9.0f}  ({100 * frac:5.1f} % of roofline)"
              f"  bytes/token {r.get('bytes_per_token', 0) / 1e6:8.1f} MB{tf}  runs {[round(x, 1) for x in r.get('runs', [])]}")
PY
  done
  for f in ${INSPECT_FORMATS:-affine4 bf16}; do
    timeout 120 "$D/lily" inspect --synth "$p" --format "$f" --context 4096 > "$OUT/inspect-$p-$f.txt" 2>&1
    echo "== inspect $p $f"; sed -n 1,4p "$OUT/inspect-$p-$f.txt"
  done
done
