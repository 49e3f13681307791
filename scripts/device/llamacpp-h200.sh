#!/usr/bin/env bash
# lily vs llama.cpp (CUDA) on the H200, Qwen3.5-35B-A3B shape with random weights, in one run.
#   llama.cpp: built from node-llama-cpp 3.22.1's source bundle for sm_90 (the npm CUDA prebuilts carry no
#              sm_90 code), model = `lily export-gguf --synth qwen3.5-35b-a3b --type q4_0` (4.5 bits/weight),
#              measured with its own llama-bench, flash attention on, default micro-batch and -ub 2048 -b 4096.
#   lily:      `lily bench --synth qwen3.5-35b-a3b --format affine4 --backend cuda` (4.5 bits/weight).
# The device has no network: everything comes from the repo tree, plus the bundle, which must be fetched
# on the dev machine first (bench/peers/fetch.sh) and passed to the device tool with
#   carry: [".cache/llamacpp/gitRelease.bundle", "build-cuda"]   (build-cuda only if lily is already built)
# Each step stays under the 10-minute command limit; run them in order on one warm machine:
#   scripts/device/llamacpp-h200.sh build    # llama.cpp CUDA (~4 min on 16 cores) + lily if absent
#   scripts/device/llamacpp-h200.sh gguf     # the Q4_0 GGUF (~19 GB) from an in-memory bf16 synth
#   scripts/device/llamacpp-h200.sh bench    # A B A B: lily bench, llama-bench default, llama-bench ub2048
#   scripts/device/llamacpp-h200.sh all      # the three in sequence (may exceed one command's limit)
# Results (raw JSON/markdown and a summary table) go to $OUT when set, else build-h200/results.
# Env: PREFILL (default 4096,16384), DEPTHS (decode contexts, default 0,4096,32768), REPEATS (3),
#      ROUNDS (2), LILY_BIN (default build-cuda/lily), WORK (default build-h200: ignored by git).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STEP="${1:-all}"
WORK="${WORK:-$ROOT/build-h200}"
BUNDLE="${LLAMACPP_BUNDLE:-$ROOT/.cache/llamacpp/gitRelease.bundle}"
LILY="${LILY_BIN:-$ROOT/build-cuda/lily}"
GGUF="$WORK/qwen35-35b-a3b-synth-q4_0.gguf"
RESULTS="${OUT:-$WORK/results}"
PREFILL="${PREFILL:-4096,16384}"
DEPTHS="${DEPTHS:-0,4096,32768}"
REPEATS="${REPEATS:-3}"
ROUNDS="${ROUNDS:-2}"
JOBS="$(nproc)"
mkdir -p "$WORK" "$RESULTS"
log() { echo "[h200 $(date +%H:%M:%S)] $*" >&2; }

build() {
  if [[ ! -x "$WORK/llama.cpp/build/bin/llama-bench" ]]; then
    [[ -f "$BUNDLE" ]] || { echo "missing $BUNDLE: run bench/peers/fetch.sh here and carry it" >&2; exit 3; }
    command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
    rm -rf "$WORK/llama.cpp"
    git clone -q "$BUNDLE" "$WORK/llama.cpp"
    log "configuring llama.cpp (CUDA, sm_90)"
    cmake -S "$WORK/llama.cpp" -B "$WORK/llama.cpp/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$WORK/llama-configure.log" 2>&1 \
      || { tail -30 "$WORK/llama-configure.log"; exit 4; }
    log "building llama-bench with $JOBS jobs"
    cmake --build "$WORK/llama.cpp/build" --target llama-bench -j"$JOBS" >"$WORK/llama-build.log" 2>&1 \
      || { tail -30 "$WORK/llama-build.log"; exit 4; }
  fi
  log "llama-bench: $WORK/llama.cpp/build/bin/llama-bench"
  if [[ ! -x "$LILY" ]]; then
    log "building lily (CUDA) in $ROOT/build-cuda"
    cmake -S "$ROOT" -B "$ROOT/build-cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_CUDA=ON -DLILY_TESTS=OFF \
      >"$WORK/lily-configure.log" 2>&1 || { tail -30 "$WORK/lily-configure.log"; exit 4; }
    cmake --build "$ROOT/build-cuda" --target lily -j"$JOBS" >"$WORK/lily-build.log" 2>&1 \
      || { tail -30 "$WORK/lily-build.log"; exit 4; }
  fi
  log "lily: $LILY"
}

gguf() {
  [[ -x "$LILY" ]] || { echo "no lily binary at $LILY (run the build step)" >&2; exit 3; }
  if [[ ! -s "$GGUF" ]]; then
    log "exporting $GGUF (in-memory bf16 synth -> Q4_0)"
    "$LILY" export-gguf --synth qwen3.5-35b-a3b --seed 1 --type q4_0 --out "$GGUF.tmp" --quiet
    mv "$GGUF.tmp" "$GGUF"
  fi
  ls -la "$GGUF" >&2
}

bench() {
  local LB="$WORK/llama.cpp/build/bin/llama-bench"
  [[ -x "$LB" && -x "$LILY" && -s "$GGUF" ]] || { echo "run the build and gguf steps first" >&2; exit 3; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RESULTS/gpu.txt" || true
  # lily's decode contexts must be >= 1; context 0 for llama-bench = a fresh sequence.
  local LDEC
  LDEC="$(echo "$DEPTHS" | tr ',' '\n' | awk '{print ($1 < 1) ? 1 : $1}' | paste -sd, -)"
  for ((r = 1; r <= ROUNDS; r++)); do
    log "round $r/$ROUNDS: lily"
    "$LILY" bench --synth qwen3.5-35b-a3b --format affine4 --backend cuda --prefill "$PREFILL" \
      --decode-context "$LDEC" --repeats "$REPEATS" --decode-tokens 64 --json > "$RESULTS/lily-$r.json"
    # Prefill at depth 0 and decode at each depth as separate runs (a combined run would also time every
    # prompt length at every depth).
    log "round $r/$ROUNDS: llama-bench default micro-batch"
    "$LB" -m "$GGUF" -ngl 99 -fa 1 -p "$PREFILL" -n 0 -r "$REPEATS" -o json > "$RESULTS/llama-pp-$r.json"
    "$LB" -m "$GGUF" -ngl 99 -fa 1 -p 0 -n 64 -d "$DEPTHS" -r "$REPEATS" -o json > "$RESULTS/llama-tg-$r.json"
    log "round $r/$ROUNDS: llama-bench -ub 2048 -b 4096"
    "$LB" -m "$GGUF" -ngl 99 -fa 1 -ub 2048 -b 4096 -p "$PREFILL" -n 0 -r "$REPEATS" -o json \
      > "$RESULTS/llama-ub2048-pp-$r.json"
    "$LB" -m "$GGUF" -ngl 99 -fa 1 -ub 2048 -b 4096 -p 0 -n 64 -d "$DEPTHS" -r "$REPEATS" -o json \
      > "$RESULTS/llama-ub2048-tg-$r.json"
  done
  python3 - "$RESULTS" "$ROUNDS" <<'EOF' | tee "$RESULTS/summary.md"
import json, statistics, sys
res, rounds = sys.argv[1], int(sys.argv[2])
def load(p): return [json.load(open(f"{res}/{p}-{r}.json")) for r in range(1, rounds + 1)]
def load2(p): return [a + b for a, b in zip(load(p + "-pp"), load(p + "-tg"))]
L, D, U = load("lily"), load2("llama"), load2("llama-ub2048")
def llama(runs, kind, n):
    # llama-bench JSON: one entry per test; prefill has n_prompt>0, n_gen=0; decode n_gen>0 at n_depth.
    v = []
    for j in runs:
        for t in j:
            if kind == "prefill" and t["n_prompt"] == n and t["n_gen"] == 0 and t.get("n_depth", 0) == 0: v.append(t["avg_ts"])
            if kind == "decode" and t["n_gen"] > 0 and t.get("n_depth", 0) == n: v.append(t["avg_ts"])
    return statistics.median(v) if v else float("nan")
def lily(kind, n):
    key = "tokens" if kind == "prefill" else "context"
    v = [x["tok_s"] for j in L for x in j[kind] if x[key] == max(n, 1)]
    return statistics.median(v) if v else float("nan")
rows = ["| figure | lily affine4 | llama.cpp Q4_0 (default ub) | llama.cpp Q4_0 (-ub 2048) | lily / best llama.cpp |",
        "|---|---:|---:|---:|---:|"]
for n in [x["tokens"] for x in L[0]["prefill"]]:
    a, b, c = lily("prefill", n), llama(D, "prefill", n), llama(U, "prefill", n)
    rows.append(f"| prefill {n} | {a:.0f} | {b:.0f} | {c:.0f} | **{a / max(b, c):.2f}x** |")
depths = sorted({t.get("n_depth", 0) for j in D for t in j if t["n_gen"] > 0})
for n in depths:
    a, b, c = lily("decode", n), llama(D, "decode", n), llama(U, "decode", n)
    rows.append(f"| decode @{n} | {a:.1f} | {b:.1f} | {c:.1f} | **{a / max(b, c):.2f}x** |")
print(f"lily peak memory {L[0]['peak_memory_bytes'] / 1e9:.1f} GB; copy bandwidth {L[0]['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s ({L[0]['copy_bandwidth_source']})")
print("\n".join(rows))
EOF
  log "raw results in $RESULTS"
}

case "$STEP" in
  build) build ;;
  gguf) gguf ;;
  bench) bench ;;
  all) build; gguf; bench ;;
  *) echo "usage: $0 build|gguf|bench|all" >&2; exit 2 ;;
esac
