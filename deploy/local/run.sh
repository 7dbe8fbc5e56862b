#!/usr/bin/env bash
# `make run`: with the local ClickHouse and Kafka up (make wraps this in with-deps.sh),
# applies the schema, makes the audit key and the API keys a local run needs (kept in
# the state folder and reused), starts `bandplane serve` sealing the trail and a
# simulated workload posting to its collector, prints where to look and the keys, and
# runs until Ctrl-C, then stops both.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$ROOT/bin/bandplane"
STATE="${BANDPLANE_STATE:-$ROOT/.local}"
LISTEN="${BANDPLANE_LISTEN:-127.0.0.1:8080}"
RATE="${BANDPLANE_SIM_RATE:-200}"
RUN="$STATE/run"
mkdir -p "$RUN"
chmod 700 "$RUN"

[[ -x "$BIN" ]] || (cd "$ROOT" && go build -o "$BIN" ./cmd/bandplane)

"$BIN" migrate

[[ -f "$RUN/audit.key" ]] || "$BIN" audit keygen --out "$RUN/audit.key" >/dev/null

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

"$BIN" serve --listen "$LISTEN" --audit-key "$RUN/audit.key" >"$RUN/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 60); do
  if curl -fsS "http://$LISTEN/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "${pids[0]}" 2>/dev/null; then
    echo "run: bandplane serve exited; last log lines:" >&2
    tail -n 30 "$RUN/serve.log" >&2
    exit 1
  fi
  sleep 0.5
done
curl -fsS "http://$LISTEN/readyz" >/dev/null || { echo "run: serve is not ready; see $RUN/serve.log" >&2; exit 1; }

# key NAME ORG ROLE: the token of the local key NAME, created once (the token is shown
# only at creation, so it is kept in $RUN/keys, readable by this user only) and made
# again if it was revoked or the database was reset.
key() {
  local name=$1 org=$2 role=$3 file="$RUN/keys/$1.json" id
  mkdir -p "$RUN/keys"
  if [[ -f "$file" ]]; then
    id=$(sed -n 's/.*"id":"\([^"]*\)".*/\1/p' "$file")
    if "$BIN" keys list | grep -F "\"id\":\"$id\"" | grep -qv '"revoked_at"'; then
      sed -n 's/.*"token":"\([^"]*\)".*/\1/p' "$file"
      return
    fi
  fi
  (umask 077 && "$BIN" keys create --org "$org" --role "$role" --name "make run: $name" >"$file")
  sed -n 's/.*"token":"\([^"]*\)".*/\1/p' "$file"
}
INGEST_KEY=$(key ingest '*' ingest)
ROUTER_KEY=$(key router '*' router)
OPERATOR_KEY=$(key operator '*' operator)
ADMIN_KEY=$(key admin '*' admin)

BANDPLANE_API_KEY="$INGEST_KEY" "$BIN" simulate --collector "http://$LISTEN" --rate "$RATE" --events 0 --quiet \
  >"$RUN/simulate.json" 2>"$RUN/simulate.log" &
pids+=($!)

# The board reads one organization: the simulated tutorial's (its owner is @maya).
BOARD_ORG=""
for _ in $(seq 1 60); do
  BOARD_ORG=$(clickhouse-client --port 19000 -q "SELECT org_id FROM bandplane.directory FINAL WHERE kind = 'user' AND handle = 'maya' LIMIT 1" 2>/dev/null || true)
  [[ -n "$BOARD_ORG" ]] && break
  sleep 0.5
done
VIEWER_KEY="(the workload's directory is not stored yet; create one: bin/bandplane keys create --org ORG --role viewer)"
[[ -n "$BOARD_ORG" ]] && VIEWER_KEY=$(key "viewer-$BOARD_ORG" "$BOARD_ORG" viewer)

cat <<MSG

bandplane is running (Ctrl-C stops it, and the dependencies this command started).

  collector     POST http://$LISTEN/v1/events     Authorization: Bearer $INGEST_KEY   (platform, ingest)
  decisions     POST http://$LISTEN/v1/decisions/ Authorization: Bearer $ROUTER_KEY   (platform, router)
  operator      POST http://$LISTEN/v1/agents/ID/suspend  Authorization: Bearer $OPERATOR_KEY
  graphql       POST http://$LISTEN/graphql       Authorization: Bearer $ADMIN_KEY   (platform, admin: name any orgId)
  graphiql      open http://$LISTEN/graphql in a browser; Headers: {"Authorization": "Bearer $ADMIN_KEY"}
  work board    open http://$LISTEN/ in a browser and give it a viewer key: $VIEWER_KEY   (org $BOARD_ORG)
  metrics       http://$LISTEN/metrics (operator or admin key)   readiness http://$LISTEN/readyz
  workload      simulated platform traffic at $RATE events/s through the collector
  keys          $RUN/keys/*.json (bandplane keys list | create | revoke)
  audit seals   every minute with $RUN/audit.key; check: bin/bandplane audit verify --audit-key $RUN/audit.key.pub
                a checkpoint to keep: bin/bandplane audit checkpoint --org ORG --key $ADMIN_KEY
  logs          $RUN/serve.log  $RUN/simulate.log
  audit trail   clickhouse-client --port 19000 -q "SELECT type, count() FROM bandplane.events FINAL GROUP BY type ORDER BY count() DESC"
  cost by agent clickhouse-client --port 19000 -q "SELECT org_id, agent_id, model, sum(cost) AS c FROM bandplane.usage_hourly FINAL GROUP BY org_id, agent_id, model ORDER BY c DESC LIMIT 10"
  dead letters  clickhouse-client --port 19000 -q "SELECT time, stage, reason FROM bandplane.dead_letters ORDER BY time DESC LIMIT 10"

MSG
wait "${pids[0]}"
