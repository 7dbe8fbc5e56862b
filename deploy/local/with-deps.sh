#!/usr/bin/env bash
# Runs a command with the local ClickHouse and Kafka up:
#
#   deploy/local/with-deps.sh CMD [ARGS...]
#
# Starts whichever of the two is not already running, runs CMD, then stops only what it
# started (also on failure, INT or TERM) and exits with CMD's status (128+signal when
# interrupted). Services that were already running are left alone.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SERVICES=(clickhouse kafka)

if [[ $# -eq 0 ]]; then
  echo "usage: $0 CMD [ARGS...]" >&2
  exit 2
fi

started=()
child=""
cleaned=""

cleanup() {
  [[ -n "$cleaned" ]] && return 0
  cleaned=1
  local i
  # Stop in reverse start order.
  for ((i = ${#started[@]} - 1; i >= 0; i--)); do
    "$HERE/${started[i]}.sh" stop || echo "with-deps: stopping ${started[i]} failed" >&2
  done
}

on_signal() {
  local sig=$1 code=$2
  trap '' INT TERM
  echo "with-deps: got SIG$sig, stopping" >&2
  if [[ -n "$child" ]] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  cleanup
  exit "$code"
}

trap cleanup EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM

for s in "${SERVICES[@]}"; do
  if "$HERE/$s.sh" status >/dev/null 2>&1; then
    echo "with-deps: $s already running, leaving it running afterwards"
  else
    # Recorded before starting, so a start that fails half-way is cleaned up too.
    started+=("$s")
    "$HERE/$s.sh" start
  fi
done

# CMD runs in the background so that INT/TERM traps fire at once (a foreground child
# would delay them until it exits). Explicit <&0 keeps CMD's stdin (bash would
# otherwise give a background command /dev/null).
rc=0
"$@" <&0 &
child=$!
wait "$child" || rc=$?
child=""
cleanup
exit "$rc"
