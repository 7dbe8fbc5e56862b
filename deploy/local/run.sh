#!/usr/bin/env bash
# `make run`: with the local ClickHouse and Kafka up (make wraps this in with-deps.sh),
# applies the schema, starts `bandplane serve` and a simulated workload posting to its
# collector, prints where to look, and runs until Ctrl-C, then stops both.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$ROOT/bin/bandplane"
STATE="${BANDPLANE_STATE:-$ROOT/.local}"
LISTEN="${BANDPLANE_LISTEN:-127.0.0.1:8080}"
RATE="${BANDPLANE_SIM_RATE:-200}"
export BANDPLANE_COLLECTOR_TOKEN="${BANDPLANE_COLLECTOR_TOKEN:-dev-token}"
mkdir -p "$STATE/run"

[[ -x "$BIN" ]] || (cd "$ROOT" && go build -o "$BIN" ./cmd/bandplane)

"$BIN" migrate

pids=()
stop() {
  trap '' INT TERM
  echo "run: stopping bandplane" >&2
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$BIN" serve --listen "$LISTEN" >"$STATE/run/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 60); do
  if curl -fsS "http://$LISTEN/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "${pids[0]}" 2>/dev/null; then
    echo "run: bandplane serve exited; last log lines:" >&2
    tail -n 30 "$STATE/run/serve.log" >&2
    exit 1
  fi
  sleep 0.5
done
curl -fsS "http://$LISTEN/readyz" >/dev/null || { echo "run: serve is not ready; see $STATE/run/serve.log" >&2; exit 1; }

"$BIN" simulate --collector "http://$LISTEN" --rate "$RATE" --events 0 --quiet \
  >"$STATE/run/simulate.json" 2>"$STATE/run/simulate.log" &
pids+=($!)

cat <<MSG

bandplane is running (Ctrl-C stops it, and the dependencies this command started).

  collector     POST http://$LISTEN/v1/events   (Authorization: Bearer $BANDPLANE_COLLECTOR_TOKEN)
  metrics       http://$LISTEN/metrics           readiness http://$LISTEN/readyz
  workload      simulated platform traffic at $RATE events/s through the collector
  logs          $STATE/run/serve.log  $STATE/run/simulate.log
  audit trail   clickhouse-client --port 19000 -q "SELECT type, count() FROM bandplane.events FINAL GROUP BY type ORDER BY 2 DESC"
  cost by agent clickhouse-client --port 19000 -q "SELECT org_id, agent_id, model, sum(cost) FROM bandplane.usage_hourly FINAL GROUP BY org_id, agent_id, model ORDER BY 4 DESC LIMIT 10"
  dead letters  clickhouse-client --port 19000 -q "SELECT time, stage, reason FROM bandplane.dead_letters ORDER BY time DESC LIMIT 10"

MSG
wait "${pids[0]}"
