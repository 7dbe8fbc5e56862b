#!/usr/bin/env bash
# `make test-cluster`: the cluster tests on a real ClickHouse cluster (cluster.sh: ZooKeeper,
# 2 shards x 2 replicas of ClickHouse 18.16) and a real three-broker Kafka (kafka.sh
# --brokers 3), both started here when they are not running and stopped afterwards
# (only what this run started; a cluster none of whose processes runs, it starts empty:
# cluster.sh reset).
# Runs:
#   - the TestIntegrationCluster* tests (a replica, a broker and an ingest process
#     SIGKILLed mid-stream; two policy replicas; migrate --cluster; topic replication);
#   - the query package's integration tests with their databases made by `migrate
#     --cluster`, so every read of the GraphQL API's queries goes through the
#     Distributed tables and is checked against the same expectations as on one server.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$HERE/../.."

started=()
cleanup() {
  local rc=$?
  local s
  for s in "${started[@]}"; do
    case "$s" in
      clickhouse) "$HERE/cluster.sh" down || rc=1 ;;
      kafka) "$HERE/kafka.sh" --brokers 3 stop || rc=1 ;;
    esac
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! "$HERE/cluster.sh" status >/dev/null 2>&1; then
  started+=(clickhouse)
  # A cluster none of whose processes runs is started empty: ZooKeeper state grown over
  # many runs (the DDL queue of every test database) has refused ClickHouse's sessions
  # after a restart ("while receiving handshake from ZooKeeper"). One partly running
  # (a node down) keeps its data.
  if ! "$HERE/cluster.sh" status 2>&1 | grep -qE ': (zookeeper )?running \('; then
    "$HERE/cluster.sh" reset
  fi
  "$HERE/cluster.sh" up
fi
if ! "$HERE/kafka.sh" --brokers 3 status >/dev/null 2>&1; then
  started+=(kafka)
  "$HERE/kafka.sh" --brokers 3 start
fi

brokers=127.0.0.1:29092,127.0.0.1:29192,127.0.0.1:29292
export BANDPLANE_INTEGRATION=1 BANDPLANE_CLUSTER_TESTS=1
export BANDPLANE_KAFKA="$brokers" BANDPLANE_CLUSTER_KAFKA="$brokers"
export BANDPLANE_CLICKHOUSE=127.0.0.1:29001,127.0.0.1:29002,127.0.0.1:29003,127.0.0.1:29004
export BANDPLANE_CLICKHOUSE_CLUSTER=bandplane

t0=$SECONDS
log="$(mktemp)"
rc=0
# -p 1: one package at a time, so that a test that kills a broker or a server never
# runs beside another package's test that needs them all.
go test -count=1 -p 1 -timeout 30m -run '^TestIntegrationCluster' -v ./ingest/ ./schema/kafka/ ./cmd/bandplane/ >"$log" 2>&1 || rc=$?
# The tests' own lines (what was killed, how long the stall was) and the verdicts.
# On failure, all of it.
if [[ $rc -eq 0 ]]; then
  grep -E '^(=== RUN|--- |PASS|FAIL|ok)|_test\.go:[0-9]+:' "$log" || true
else
  cat "$log"
fi
rm -f "$log"
[[ $rc -eq 0 ]] || { echo "test-cluster: cluster tests failed" >&2; exit 1; }
echo "test-cluster: cluster tests passed in $((SECONDS - t0)) s"
t1=$SECONDS
go test -count=1 -timeout 20m ./query/
echo "test-cluster: query integration tests on the cluster passed in $((SECONDS - t1)) s"
