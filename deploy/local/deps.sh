#!/usr/bin/env bash
# Both local dependencies of bandplane (ClickHouse and Kafka), see README.md beside this file.
#
#   deploy/local/deps.sh up|down|status
#
# `status` exits 0 when both are running, 3 otherwise.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

case "${1:-}" in
  up)
    "$HERE/clickhouse.sh" start
    "$HERE/kafka.sh" start
    ;;
  down)
    rc=0
    "$HERE/kafka.sh" stop || rc=$?
    "$HERE/clickhouse.sh" stop || rc=$?
    exit "$rc"
    ;;
  status)
    rc=0
    "$HERE/clickhouse.sh" status || rc=3
    "$HERE/kafka.sh" status || rc=3
    exit "$rc"
    ;;
  *)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac
