#!/usr/bin/env bash
# Soak test: starts `lily serve` on the demo model (CPU), then N concurrent streaming clients with mixed
# parameters, mid-stream hang-ups and hostile requests for a fixed time (scripts/soak.py); prints errors,
# 5xx, p50/p99 time to first token, aggregate tokens/s and the server's RSS at start and end.
# Usage: scripts/soak.sh [--clients 64] [--seconds 600] [--parallel 64] [--port 0] [-- extra serve flags]
# With --port P (not 0) and LILY_SOAK_PID set, it soaks an already running server instead.
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS=64 SECONDS_=600 PARALLEL=64 PORT=0 BIN=${LILY_BIN:-build/lily}
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --clients) CLIENTS=$2; shift 2 ;;
    --seconds) SECONDS_=$2; shift 2 ;;
    --parallel) PARALLEL=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "soak: unknown option $1" >&2; exit 2 ;;
  esac
done
echo "soak: $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$PORT" != 0 ] && [ -n "${LILY_SOAK_PID:-}" ]; then
  exec python3 scripts/soak.py --port "$PORT" --pid "$LILY_SOAK_PID" --clients "$CLIENTS" --seconds "$SECONDS_"
fi
LOG=$(mktemp)
# A deadline per request: the hostile mix sends valid requests that would otherwise generate up to
# --max-tokens (4096) at a 64th of the throughput, past any client's patience (soak.py waits 90 s).
"$BIN" serve --port "$PORT" --parallel "$PARALLEL" --queue "$CLIENTS" --ctx-size 2048 --request-timeout 60 "${EXTRA[@]}" \
  >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 600); do
  grep -q "listening on" "$LOG" && break
  kill -0 $PID 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.1
done
PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$LOG")
echo "soak: server pid $PID on port $PORT (--parallel $PARALLEL --queue $CLIENTS --request-timeout 60 ${EXTRA[*]:-})"
rc=0
python3 scripts/soak.py --port "$PORT" --pid "$PID" --clients "$CLIENTS" --seconds "$SECONDS_" || rc=$?
echo "soak: load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
kill -TERM $PID
wait $PID || { echo "soak: the server exited with $?"; rc=1; }
exit $rc
