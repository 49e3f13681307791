#!/usr/bin/env bash
# lily vs llama.cpp on the CPU, same architecture and size, alternating A B A B in one run.
#   lily:      `lily synth --preset small --format affine4` (MLX affine 4-bit, group 64: 4.5 bits/weight)
#   llama.cpp: the same preset synthesised in bf16 and exported with `lily export-gguf --type q4_0`
#              (Q4_0: 4.5 bits/weight), run by bench/peers/llama-peer against node-llama-cpp 3.22.1's
#              prebuilt CPU libraries (fetched by bench/peers/fetch.sh; nothing of theirs is committed).
# Both are timed the same way (random prompt ids, warm-up, median of repeats; decode after a cheap fill).
# The weights are random draws of the same shapes, not the same numbers: speed does not depend on them.
# Usage: scripts/compare-llamacpp.sh [--threads 2] [--preset small] [--prefill 512] [--decode-context 256]
#                                    [--repeats 3] [--rounds 2] [--decode-tokens 32] [--markdown FILE] [--cpu-time]
# --cpu-time: instead of wall-clock rates, CPU seconds (user + sys) per token, from the difference of two
#   runs of each engine that differ only in the prompt length (prefill) or in the decoded tokens (decode),
#   alternated the same way. Robust on a loaded host, where wall-clock rates measure the scheduler; use it
#   with --threads 1 (with more threads it counts the pools' spinning).
# Env: LILY_BIN (default: build-compare/lily, built if absent), LILY_PEER_BUILD (llama-peer's build folder,
#      default build-compare/peers, built if absent), LILY_COMPARE_DIR (models, default .cache/compare).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
THREADS=2 PRESET=small PREFILL=512 DECODE=256 REPEATS=3 ROUNDS=2 DTOK=32 MD="" CPUTIME=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) THREADS="$2"; shift 2 ;;
    --preset) PRESET="$2"; shift 2 ;;
    --prefill) PREFILL="$2"; shift 2 ;;
    --decode-context) DECODE="$2"; shift 2 ;;
    --repeats) REPEATS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --decode-tokens) DTOK="$2"; shift 2 ;;
    --markdown) MD="$2"; shift 2 ;;
    --cpu-time) CPUTIME=1; shift ;;
    *) echo "compare-llamacpp.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
BUILD="$ROOT/build-compare"
LILY="${LILY_BIN:-$BUILD/lily}"
WORK="${LILY_COMPARE_DIR:-$ROOT/.cache/compare}"
mkdir -p "$WORK"
log() { echo "[compare] $*" >&2; }
to_md() { if [[ -n "$MD" ]]; then tee "$MD"; else cat; fi; }  # the table on stdout, and into --markdown FILE

if [[ ! -x "$LILY" ]]; then
  log "building lily in $BUILD"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_CUDA=OFF -DLILY_TESTS=OFF >/dev/null
  cmake --build "$BUILD" --target lily -j"$(nproc)" >/dev/null
fi
PEERS="$("$ROOT/bench/peers/fetch.sh" | tail -1)"
PEER_BUILD="${LILY_PEER_BUILD:-$BUILD/peers}"
PEER="$PEER_BUILD/llama-peer"
if [[ ! -x "$PEER" ]]; then
  log "building bench/peers against $PEERS"
  cmake -S "$ROOT/bench/peers" -B "$PEER_BUILD" -G Ninja -DLLAMA_SRC="$PEERS/src" -DLLAMA_LIBS="$PEERS/libs" >/dev/null
  cmake --build "$PEER_BUILD" >/dev/null
fi

A4="$WORK/$PRESET-affine4" BF="$WORK/$PRESET-bf16" GG="$WORK/$PRESET-q4_0.gguf"
[[ -f "$A4/model.safetensors.index.json" ]] || { log "synth $PRESET affine4"; "$LILY" synth --preset "$PRESET" --format affine4 --out "$A4" --seed 1 >&2; }
if [[ ! -f "$GG" ]]; then
  [[ -f "$BF/model.safetensors.index.json" ]] || { log "synth $PRESET bf16"; "$LILY" synth --preset "$PRESET" --format bf16 --out "$BF" --seed 1 >&2; }
  log "export $GG (q4_0)"
  "$LILY" export-gguf --model "$BF" --out "$GG" --type q4_0 --quiet
  rm -rf "$BF"  # only the GGUF is needed from here on
fi

RES="$WORK/results-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$RES"
if [[ $CPUTIME == 1 ]]; then
  # Each engine: a prompt of PREFILL vs 1 token, DTOK vs 1 decoded token per run (repeats + 1 warm-up each).
  cpu() {  # cpu OUTFILE CMD...: CPU seconds of CMD into OUTFILE
    local out="$1"; shift
    /usr/bin/time -f "%U %S" -o "$out.time" "$@" >/dev/null 2>"$out.err" || { cat "$out.err" >&2; exit 1; }
    awk '{print $1 + $2}' "$out.time" > "$out"
  }
  lily_run() { cpu "$1" "$LILY" --threads "$THREADS" bench --model "$A4" --prefill "$2" --decode-context "$DECODE" \
    --repeats "$REPEATS" --decode-tokens "$3"; }
  llama_run() { cpu "$1" "$PEER" bench --model "$GG" --threads "$THREADS" --prefill "$2" --decode-context "$DECODE" \
    --repeats "$REPEATS" --decode-tokens "$3"; }
  for ((r = 1; r <= ROUNDS; r++)); do
    for who in lily llama; do
      echo "$who-$r start $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RES/loadavg.txt"
      log "round $r/$ROUNDS: $who (CPU time)"
      ${who}_run "$RES/$who-$r-base" 1 1
      ${who}_run "$RES/$who-$r-prefill" "$PREFILL" 1
      ${who}_run "$RES/$who-$r-decode" 1 "$DTOK"
    done
  done
  echo "end $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RES/loadavg.txt"
  python3 - "$RES" "$ROUNDS" "$THREADS" "$PRESET" "$PREFILL" "$DTOK" "$REPEATS" "$DECODE" <<'EOF' | to_md
import statistics, sys, os
res, rounds, threads, preset = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
P, D, reps, ctx = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), sys.argv[8]
runs = reps + 1  # bench: one warm-up, then the timed repeats
def ms(who, what, n):
    base = lambda r: float(open(f"{res}/{who}-{r}-base").read())
    v = [(float(open(f"{res}/{who}-{r}-{what}").read()) - base(r)) * 1e3 / (runs * (n - 1)) for r in range(1, rounds + 1)]
    return statistics.median(v), v
loads = [l.split()[-3] for l in open(f"{res}/loadavg.txt")]
lines = [f"CPU time per token (user + sys), {threads} thread(s); model: synth `{preset}`; {rounds} alternating rounds, "
         f"median; 1-minute load average at the start of each engine's runs: {', '.join(loads)} "
         f"(the host has {os.cpu_count()} cores)",
         "", "| figure | lily affine4 ms/token | llama.cpp Q4_0 ms/token | llama.cpp / lily |", "|---|---:|---:|---:|"]
for what, n, name in (("prefill", P, f"prefill {P}"), ("decode", D, f"decode @{ctx}")):
    a, av = ms("lily", what, n)
    b, bv = ms("llama", what, n)
    lines.append(f"| {name} | {a:.2f} ({', '.join(f'{x:.2f}' for x in av)}) | {b:.2f} ({', '.join(f'{x:.2f}' for x in bv)}) "
                 f"| **{b/a:.2f}x** |")
print("\n".join(lines))
EOF
  log "raw CPU times in $RES"
  exit 0
fi
for ((r = 1; r <= ROUNDS; r++)); do
  echo "lily-$r start $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RES/loadavg.txt"
  log "round $r/$ROUNDS: lily"
  "$LILY" --threads "$THREADS" bench --model "$A4" --prefill "$PREFILL" --decode-context "$DECODE" \
    --repeats "$REPEATS" --decode-tokens "$DTOK" --json > "$RES/lily-$r.json"
  echo "llama-$r start $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RES/loadavg.txt"
  log "round $r/$ROUNDS: llama.cpp"
  "$PEER" bench --model "$GG" --threads "$THREADS" --prefill "$PREFILL" --decode-context "$DECODE" \
    --repeats "$REPEATS" --decode-tokens "$DTOK" > "$RES/llama-$r.json"
done
echo "end $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RES/loadavg.txt"

python3 - "$RES" "$ROUNDS" "$THREADS" "$PRESET" <<'EOF' | to_md
import json, statistics, sys, platform, os
res, rounds, threads, preset = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(prefix):
    return [json.load(open(f"{res}/{prefix}-{r}.json")) for r in range(1, rounds + 1)]
L, P = load("lily"), load("llama")
def fig(runs, phase, key, n):
    v = [next(x["tok_s"] for x in j[phase] if x[key] == n) for j in runs]
    return statistics.median(v), v
cpu = ""
try:
    cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
except Exception:
    pass
loads = [l.split()[-3] for l in open(f"{res}/loadavg.txt")]
lines = [f"CPU: {cpu}, {threads} threads; model: synth `{preset}` "
         f"({L[0]['weight_bytes']/1e9:.2f} GB affine4 in lily); {rounds} alternating rounds, median of rounds "
         f"(each round itself a median of repeats); lily copy bandwidth {L[0]['copy_bandwidth_bytes_per_s']/1e9:.1f} GB/s; "
         f"1-minute load average at the start of each run: {', '.join(loads)} (the host has {os.cpu_count()} cores)",
         "",
         "| figure | lily affine4 tok/s | llama.cpp Q4_0 tok/s | lily / llama.cpp | lily % of memory roofline |",
         "|---|---:|---:|---:|---:|"]
for phase, key, name in (("prefill", "tokens", "prefill"), ("decode", "context", "decode @")):
    for row in L[0][phase]:
        n = row[key]
        a, av = fig(L, phase, key, n)
        b, bv = fig(P, phase, key, n)
        roof = statistics.median(next(x["fraction_of_roofline"] for x in j[phase] if x[key] == n) for j in L)
        lines.append(f"| {name} {n} | {a:.1f} ({', '.join(f'{x:.1f}' for x in av)}) | {b:.1f} ({', '.join(f'{x:.1f}' for x in bv)}) "
                     f"| **{a/b:.2f}x** | {100*roof:.1f}% |")
print("\n".join(lines))
EOF
log "raw JSON in $RES"
