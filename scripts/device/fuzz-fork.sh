#!/usr/bin/env bash
# Runs on the GPU machine: one libFuzzer target of the .devfuzz bundle (scripts/device/fuzz-bundle.sh) in
# libFuzzer's fork mode, one job per core but one, until RUNS executions or SECONDS. Crashes, hangs
# (> 30 s, the limit scripts/fuzz.sh uses for long runs) and out-of-memory (> 2 GB) all stop the run: fork
# mode would skip the last two by default. The log and any failing input come back under $OUT/fuzz-TARGET/.
# Usage: scripts/device/fuzz-fork.sh TARGET [RUNS (10000000)] [SECONDS (540)]
#   FUZZ_FORK_JOBS=N  jobs (default: one per core but one). Runs here too (after fuzz-bundle.sh), e.g. with
#                     FUZZ_FORK_JOBS=2 OUT=/tmp/fz on a 2-core host.
set -uo pipefail
t=$1 runs=${2:-10000000} secs=${3:-540}
W=/tmp/lily-fuzz && rm -rf "$W" && mkdir -p "$W" && tar -C "$W" -xzf .devfuzz/bundle.tgz
O=${OUT:-/tmp}/fuzz-$t && mkdir -p "$O/artifacts"
jobs=${FUZZ_FORK_JOBS:-$(( $(nproc) > 2 ? $(nproc) - 1 : 1 ))}
extra=()
[ -f "fuzz/dict/$t.dict" ] && extra=(-dict="fuzz/dict/$t.dict")
echo "fuzz-fork: $t, $jobs jobs, $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
start=$(date +%s)
ASAN_OPTIONS=malloc_context_size=0 LD_LIBRARY_PATH="$W/lib" "$W/fuzz_$t" -fork="$jobs" -runs="$runs" \
  -max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 -ignore_crashes=0 -ignore_timeouts=0 -ignore_ooms=0 \
  -artifact_prefix="$O/artifacts/" "${extra[@]}" "$W/corpus/$t" "fuzz/corpus/$t" >"$O/log" 2>&1
rc=$?
echo "fuzz-fork: exit $rc after $(( $(date +%s) - start )) s; corpus $(ls "$W/corpus/$t" | wc -l) entries"
grep -E '^#[0-9]+: ' "$O/log" | tail -3
grep -E 'INFO: (fuzzed for|exiting)|ERROR|SUMMARY|crash|timeout' "$O/log" | grep -v '^#' | tail -8
ls -la "$O/artifacts"
exit $rc
