#!/usr/bin/env bash
# Local Kafka 4.4 for bandplane development and CI: one KRaft node (broker+controller),
# loopback only, non-default ports, config/data/logs under $BANDPLANE_STATE/kafka
# (default <repo>/.local/kafka). Jars come from Maven Central through
# deploy/local/kafka/pom.xml into a cache outside the repository.
#
#   deploy/local/kafka.sh start|stop|status|restart
#
# Environment:
#   BANDPLANE_STATE                  state folder (default: <repo root>/.local)
#   BANDPLANE_CACHE                  jar cache (default: $HOME/.cache/bandplane)
#   BANDPLANE_KAFKA_PORT             client (PLAINTEXT) port (default 19092)
#   BANDPLANE_KAFKA_CONTROLLER_PORT  KRaft controller port (default 19093)
#   BANDPLANE_KAFKA_HEAP             JVM heap options (default "-Xms256m -Xmx1g")
#   BANDPLANE_KAFKA_START_TIMEOUT    seconds to wait for the broker (default 90)
#
# `status` exits 0 when running, 3 when not. Needs Java 17+ and Maven (installed with
# apt-get when missing).
set -euo pipefail

KAFKA_VERSION=4.4.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STATE="${BANDPLANE_STATE:-$ROOT/.local}"
mkdir -p "$STATE"
STATE="$(cd "$STATE" && pwd)"
K_DIR="$STATE/kafka"
DATA_DIR="$K_DIR/data"
LOG_DIR="$K_DIR/log"
PID_FILE="$K_DIR/kafka.pid"
PROPS="$K_DIR/server.properties"
CLUSTER_ID_FILE="$K_DIR/cluster.id"
CACHE="${BANDPLANE_CACHE:-$HOME/.cache/bandplane}"
LIB="$CACHE/kafka-$KAFKA_VERSION/lib"
MARKER="$LIB/.complete"
POM="$HERE/kafka/pom.xml"
PORT="${BANDPLANE_KAFKA_PORT:-19092}"
CONTROLLER_PORT="${BANDPLANE_KAFKA_CONTROLLER_PORT:-19093}"
HEAP="${BANDPLANE_KAFKA_HEAP:--Xms256m -Xmx1g}"
START_TIMEOUT="${BANDPLANE_KAFKA_START_TIMEOUT:-90}"
STOP_TIMEOUT=30

say() { echo "kafka: $*"; }
die() { echo "kafka: ERROR: $*" >&2; exit 1; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

apt_install() {
  command -v apt-get >/dev/null || die "$* missing and apt-get is unavailable; install it by hand"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "$* missing; run as root or install sudo"
    sudo=(sudo)
  fi
  say "installing Debian packages: $* ..."
  if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then "${sudo[@]}" apt-get update -q; fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" \
    || { "${sudo[@]}" apt-get update -q &&
         "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"; } \
    || die "apt-get install $* failed"
}

java_major() {
  java -XshowSettings:properties -version 2>&1 | awk -F' = ' '/java.specification.version/ { print $2 }' | cut -d. -f1
}

ensure_java() {
  command -v java >/dev/null || apt_install openjdk-17-jre-headless
  local v
  v="$(java_major)"
  [[ -n "$v" && "$v" -ge 17 ]] || die "Kafka $KAFKA_VERSION needs Java 17 or newer (found: ${v:-unknown})"
}

pom_sum() { sha256sum "$POM" | cut -d' ' -f1; }

# Fetches the broker's jars into $LIB unless a marker from a complete download of the
# current pom.xml is there. Downloads into a fresh folder and swaps it in, so a partial
# or older set of jars is never mixed with a new one.
ensure_jars() {
  if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$(pom_sum)" ]]; then return 0; fi
  command -v mvn >/dev/null || apt_install maven
  mkdir -p "$(dirname "$LIB")"
  exec 9>"$(dirname "$LIB")/.lock"
  flock 9
  if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$(pom_sum)" ]]; then exec 9>&-; return 0; fi
  local t0=$EPOCHREALTIME tmp="$LIB.tmp.$$"
  rm -rf "$tmp"
  say "fetching Kafka $KAFKA_VERSION jars with Maven into $LIB ..."
  # (Maven 3.8 prints ANSI resets even in batch mode; strip them.)
  if ! mvn -B -q -Dstyle.color=never -f "$POM" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$tmp" 2>&1 | sed -e 's/\x1b\[[0-9;]*m//g'; then
    rm -rf "$tmp"
    die "mvn dependency:copy-dependencies failed"
  fi
  compgen -G "$tmp/kafka_2.13-$KAFKA_VERSION.jar" >/dev/null || { rm -rf "$tmp"; die "download incomplete: no kafka_2.13-$KAFKA_VERSION.jar"; }
  pom_sum >"$tmp/.complete"
  rm -rf "$LIB"
  mv "$tmp" "$LIB"
  exec 9>&-
  say "jars ready ($(find "$LIB" -name '*.jar' | wc -l) files, $(elapsed "$t0")s)"
}

port_open() {
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# Prints the pid if the pid file names a live broker started with our server.properties.
our_pid() {
  [[ -f "$PID_FILE" ]] || return 1
  local pid
  pid="$(tr -dc '0-9' <"$PID_FILE")"
  [[ -n "$pid" ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  local cmdline
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
  [[ "$cmdline" == *java* && "$cmdline" == *kafka.Kafka* && "$cmdline" == *"$PROPS"* ]] || return 1
  echo "$pid"
}

is_running() { our_pid >/dev/null; }

render_config() {
  mkdir -p "$DATA_DIR" "$LOG_DIR"
  local tmp="$PROPS.tmp.$$"
  sed -e "s#@DATA_DIR@#$DATA_DIR#g" \
      -e "s#@PORT@#$PORT#g" \
      -e "s#@CONTROLLER_PORT@#$CONTROLLER_PORT#g" \
      "$HERE/kafka/server.properties" >"$tmp"
  mv -f "$tmp" "$PROPS"
}

kafka_java() {
  java -Dlog4j2.configurationFile="$HERE/kafka/log4j2.xml" -Dkafka.logs.dir="$LOG_DIR" \
    -cp "$LIB/*" "$@"
}

format_storage() {
  [[ -f "$DATA_DIR/meta.properties" ]] && return 0
  local id
  if [[ -s "$CLUSTER_ID_FILE" ]]; then
    id="$(cat "$CLUSTER_ID_FILE")"
  else
    id="$(kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
    [[ "$id" =~ ^[A-Za-z0-9_-]{22}$ ]] || die "StorageTool random-uuid printed no cluster id: '$id'"
    echo "$id" >"$CLUSTER_ID_FILE"
  fi
  say "formatting $DATA_DIR (cluster id $id, standalone controller)"
  kafka_java kafka.tools.StorageTool format --standalone -t "$id" -c "$PROPS" >>"$LOG_DIR/format.log" 2>&1 \
    || { tail -n 30 "$LOG_DIR/format.log" >&2; die "kafka-storage format failed (see $LOG_DIR/format.log)"; }
  # The controller's endpoint is written into the metadata log at format time.
  echo "$CONTROLLER_PORT" >"$K_DIR/formatted.controller-port"
}

log_tail() {
  local f
  for f in "$LOG_DIR/server.log" "$LOG_DIR/stdout.log"; do
    if [[ -s "$f" ]]; then
      echo "kafka: ---- last 30 lines of $f ----" >&2
      tail -n 30 "$f" >&2
    fi
  done
}

file_size() { stat -c %s "$1" 2>/dev/null || echo 0; }

do_start() {
  local t0=$EPOCHREALTIME pid
  if pid="$(our_pid)"; then
    say "already running (pid $pid, 127.0.0.1:$PORT)"
    return 0
  fi
  ensure_java
  ensure_jars
  for p in "$PORT" "$CONTROLLER_PORT"; do
    if port_open "$p"; then
      die "port 127.0.0.1:$p is already in use by another process (set BANDPLANE_KAFKA_PORT / BANDPLANE_KAFKA_CONTROLLER_PORT)"
    fi
  done
  render_config
  format_storage
  if [[ -f "$K_DIR/formatted.controller-port" && "$(cat "$K_DIR/formatted.controller-port")" != "$CONTROLLER_PORT" ]]; then
    say "warning: storage was formatted with controller port $(cat "$K_DIR/formatted.controller-port"), now $CONTROLLER_PORT; if the broker does not start, remove $K_DIR and retry"
  fi
  rm -f "$PID_FILE"
  local log="$LOG_DIR/server.log" offset
  offset="$(file_size "$log")"
  say "starting broker (127.0.0.1:$PORT, controller 127.0.0.1:$CONTROLLER_PORT, state $K_DIR)"
  # setsid: own session and process group, so a terminal's Ctrl-C or a wrapper's process
  # group kill does not reach the broker. setsid forks when the caller leads a process
  # group, so $! is not reliable: the launched shell writes its own pid, then execs the JVM.
  # shellcheck disable=SC2016,SC2086
  setsid bash -c 'echo $$ >"$1"; cd "$2"; shift 2; exec nohup "$@"' kafka-launch "$PID_FILE" "$K_DIR" \
    java $HEAP -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HERE/kafka/log4j2.xml" -Dkafka.logs.dir="$LOG_DIR" \
    -cp "$LIB/*" kafka.Kafka "$PROPS" </dev/null >>"$LOG_DIR/stdout.log" 2>&1 &
  local i
  for i in $(seq 1 50); do
    [[ -s "$PID_FILE" ]] && break
    sleep 0.1
  done
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ -n "$pid" ]] || die "launcher wrote no pid file"
  # Give exec a moment, so the command line check in our_pid sees the JVM.
  for i in $(seq 1 20); do
    is_running && break
    sleep 0.1
  done

  local deadline=$((SECONDS + START_TIMEOUT)) ready=""
  while ((SECONDS < deadline)); do
    if ! is_running; then
      log_tail
      # Defensive: never leave a half-started launcher/JVM of ours behind.
      if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$PROPS"; then
        kill -KILL "$pid" 2>/dev/null || true
      fi
      rm -f "$PID_FILE"
      die "broker exited during start-up"
    fi
    # Lines written since this start (the whole file if log4j rolled it meanwhile).
    local size from=$((offset + 1))
    size="$(file_size "$log")"
    ((size >= offset)) || from=1
    if tail -c +"$from" "$log" 2>/dev/null | grep -q 'Kafka Server started' && port_open "$PORT"; then
      ready=1
      break
    fi
    sleep 0.3
  done
  if [[ -z "$ready" ]]; then
    log_tail
    do_stop >/dev/null 2>&1 || true
    die "broker not ready on 127.0.0.1:$PORT within ${START_TIMEOUT}s"
  fi
  say "started Kafka $KAFKA_VERSION (pid $pid) in $(elapsed "$t0")s"
  say "  bootstrap servers 127.0.0.1:$PORT (PLAINTEXT), controller 127.0.0.1:$CONTROLLER_PORT"
  say "  logs $LOG_DIR/server.log (JVM output $LOG_DIR/stdout.log); data $DATA_DIR"
}

do_stop() {
  local pid
  if ! pid="$(our_pid)"; then
    if [[ -f "$PID_FILE" ]]; then
      say "not running (removing stale pid file)"
      rm -f "$PID_FILE"
    else
      say "not running"
    fi
    return 0
  fi
  say "stopping (pid $pid) ..."
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    say "still running after ${STOP_TIMEOUT}s, sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  fi
  rm -f "$PID_FILE"
  say "stopped"
}

do_status() {
  local pid
  if pid="$(our_pid)"; then
    if port_open "$PORT"; then
      say "running (pid $pid, 127.0.0.1:$PORT, logs $LOG_DIR/server.log)"
      return 0
    fi
    say "process $pid is alive but 127.0.0.1:$PORT is not accepting connections"
    return 3
  fi
  say "not running"
  return 3
}

case "${1:-}" in
  start) do_start ;;
  stop) do_stop ;;
  restart) do_stop; do_start ;;
  status) rc=0; do_status || rc=$?; exit "$rc" ;;
  *) echo "usage: $0 start|stop|status|restart" >&2; exit 2 ;;
esac
