#!/usr/bin/env bash
# Local Kafka 4.4 for bandplane development and CI, loopback only, non-default ports.
# Jars come from Maven Central through deploy/local/kafka/pom.xml into a cache outside
# the repository.
#
#   deploy/local/kafka.sh [--brokers 1] start|stop|status|restart
#   deploy/local/kafka.sh --brokers 3 start|stop|status|restart|kill-node N|start-node N
#
# --brokers 1 (the default): one KRaft node (broker+controller), config/data/logs under
# $BANDPLANE_STATE/kafka (default <repo>/.local/kafka).
#
# --brokers 3: three KRaft nodes, each a combined broker+controller (a controller quorum
# of three voters: any one node can die and the cluster keeps working), config/data/logs
# under $BANDPLANE_STATE/kafka-cluster/node-N, their own cluster id; topics default to
# replication factor 3 with min.insync.replicas=2 (see kafka/cluster.properties).
# `kill-node N` SIGKILLs node N (for tests); `start-node N` starts it again and waits
# until it is back in the cluster (registered with the controller and unfenced).
#
# Environment:
#   BANDPLANE_STATE                  state folder (default: <repo root>/.local)
#   BANDPLANE_CACHE                  jar cache (default: $HOME/.cache/bandplane)
#   BANDPLANE_KAFKA_PORT             client (PLAINTEXT) port (default 19092)
#   BANDPLANE_KAFKA_CONTROLLER_PORT  KRaft controller port (default 19093)
#   BANDPLANE_KAFKA_CLUSTER_PORTS    --brokers 3: client ports of nodes 1,2,3
#                                    (default 29092,29192,29292)
#   BANDPLANE_KAFKA_CLUSTER_CONTROLLER_PORTS  --brokers 3: controller ports of nodes
#                                    1,2,3 (default 29093,29193,29293)
#   BANDPLANE_KAFKA_HEAP             JVM heap options, per node (default "-Xms256m -Xmx1g";
#                                    --brokers 3: "-Xms128m -Xmx512m")
#   BANDPLANE_KAFKA_START_TIMEOUT    seconds to wait for the broker(s) (default 90;
#                                    --brokers 3: 120)
#
# `status` exits 0 when running (every node, with --brokers 3), 3 when not. Needs Java
# 17+ and Maven (installed with apt-get when missing).
set -euo pipefail

KAFKA_VERSION=4.4.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
LABEL=kafka

say() { echo "$LABEL: $*"; }
die() { echo "$LABEL: ERROR: $*" >&2; exit 1; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

usage() {
  echo "usage: $0 [--brokers 1] start|stop|status|restart" >&2
  echo "       $0 --brokers 3 start|stop|status|restart|kill-node N|start-node N" >&2
  exit 2
}

BROKERS=1
ARGS=()
while (($#)); do
  case "$1" in
    --brokers) (($# >= 2)) || usage; BROKERS="$2"; shift 2 ;;
    --brokers=*) BROKERS="${1#--brokers=}"; shift ;;
    -h | --help) usage ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
[[ "$BROKERS" == 1 || "$BROKERS" == 3 ]] || die "--brokers must be 1 or 3, got '$BROKERS'"
CMD="${ARGS[0]:-}"

STATE="${BANDPLANE_STATE:-$ROOT/.local}"
mkdir -p "$STATE"
STATE="$(cd "$STATE" && pwd)"
K_DIR="$STATE/kafka"
DATA_DIR="$K_DIR/data"
LOG_DIR="$K_DIR/log"
PID_FILE="$K_DIR/kafka.pid"
PROPS="$K_DIR/server.properties"
TEMPLATE="$HERE/kafka/server.properties"
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
JVM_EXTRA=()

# The three-node cluster: node N's settings are selected with use_node N.
C_DIR="$STATE/kafka-cluster"
NODES=(1 2 3)
if [[ "$BROKERS" == 3 ]]; then
  IFS=, read -r -a C_PORTS <<<"${BANDPLANE_KAFKA_CLUSTER_PORTS:-29092,29192,29292}"
  IFS=, read -r -a C_CONTROLLER_PORTS <<<"${BANDPLANE_KAFKA_CLUSTER_CONTROLLER_PORTS:-29093,29193,29293}"
  ((${#C_PORTS[@]} == 3)) || die "BANDPLANE_KAFKA_CLUSTER_PORTS must list 3 ports (nodes 1,2,3), got '${C_PORTS[*]}'"
  ((${#C_CONTROLLER_PORTS[@]} == 3)) || die "BANDPLANE_KAFKA_CLUSTER_CONTROLLER_PORTS must list 3 ports (nodes 1,2,3), got '${C_CONTROLLER_PORTS[*]}'"
  for p in "${C_PORTS[@]}" "${C_CONTROLLER_PORTS[@]}"; do
    [[ "$p" =~ ^[0-9]+$ ]] && ((p > 0 && p < 65536)) || die "not a port: '$p' (BANDPLANE_KAFKA_CLUSTER_PORTS / BANDPLANE_KAFKA_CLUSTER_CONTROLLER_PORTS)"
  done
  [[ "$(printf '%s\n' "${C_PORTS[@]}" "${C_CONTROLLER_PORTS[@]}" | sort -u | wc -l)" == 6 ]] \
    || die "the cluster's six ports must differ: clients ${C_PORTS[*]}, controllers ${C_CONTROLLER_PORTS[*]}"
  C_BOOTSTRAP="127.0.0.1:${C_PORTS[0]},127.0.0.1:${C_PORTS[1]},127.0.0.1:${C_PORTS[2]}"
  C_CONTROLLERS="127.0.0.1:${C_CONTROLLER_PORTS[0]},127.0.0.1:${C_CONTROLLER_PORTS[1]},127.0.0.1:${C_CONTROLLER_PORTS[2]}"
  HEAP="${BANDPLANE_KAFKA_HEAP:--Xms128m -Xmx512m}"
  START_TIMEOUT="${BANDPLANE_KAFKA_START_TIMEOUT:-120}"
  # Three JVMs on a small shared box: the client compiler only. A node's start then takes
  # about half the CPU time (measured on 2 cores: 7-8 s instead of 10-15 s), which is
  # what `start` and `start-node` wait for; a local cluster never needs C2's peak speed.
  JVM_EXTRA=(-XX:TieredStopAtLevel=1)
fi

use_node() {
  NODE="$1"
  LABEL="kafka node-$1"
  K_DIR="$C_DIR/node-$1"
  DATA_DIR="$K_DIR/data"
  LOG_DIR="$K_DIR/log"
  PID_FILE="$K_DIR/kafka.pid"
  PROPS="$K_DIR/server.properties"
  TEMPLATE="$HERE/kafka/cluster.properties"
  CLUSTER_ID_FILE="$C_DIR/cluster.id"
  PORT="${C_PORTS[$1 - 1]}"
  CONTROLLER_PORT="${C_CONTROLLER_PORTS[$1 - 1]}"
}

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
      -e "s#@NODE_ID@#${NODE:-1}#g" \
      -e "s#@BOOTSTRAP_CONTROLLERS@#${C_CONTROLLERS:-}#g" \
      "$TEMPLATE" >"$tmp"
  mv -f "$tmp" "$PROPS"
}

kafka_java() {
  java -Dlog4j2.configurationFile="$HERE/kafka/log4j2.xml" -Dkafka.logs.dir="$LOG_DIR" \
    -cp "$LIB/*" "$@"
}

random_uuid() {
  local id
  id="$(kafka_java kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
  [[ "$id" =~ ^[A-Za-z0-9_-]{22}$ ]] || die "StorageTool random-uuid printed no id: '$id'"
  echo "$id"
}

format_storage() {
  [[ -f "$DATA_DIR/meta.properties" ]] && return 0
  local id
  if [[ -s "$CLUSTER_ID_FILE" ]]; then
    id="$(cat "$CLUSTER_ID_FILE")"
  else
    id="$(random_uuid)"
    echo "$id" >"$CLUSTER_ID_FILE"
  fi
  say "formatting $DATA_DIR (cluster id $id, standalone controller)"
  kafka_java kafka.tools.StorageTool format --standalone -t "$id" -c "$PROPS" >>"$LOG_DIR/format.log" 2>&1 \
    || { tail -n 30 "$LOG_DIR/format.log" >&2; die "kafka-storage format failed (see $LOG_DIR/format.log)"; }
  # The controller's endpoint is written into the metadata log at format time.
  echo "$CONTROLLER_PORT" >"$K_DIR/formatted.controller-port"
}

# Formats the three nodes' storage, once, as one cluster whose quorum has all three as
# voters from the start.
#
# Why --initial-controllers (a dynamic KIP-853 quorum, kraft.version 1) and not a static
# controller.quorum.voters: it is how Kafka 4.x documents bootstrapping several
# controllers, the single node above is dynamic too (--standalone), and a dynamic quorum
# can later gain or lose controllers (kafka-metadata-quorum add-controller) where a
# static one needs every node's config changed. The cost is the same as the single
# node's: the controller endpoints are written into the metadata log at format time,
# so changing a controller port needs a fresh cluster (remove $C_DIR).
#
# All three are formatted or none: a voter whose metadata log was lost cannot simply be
# formatted again and rejoin (it could vote for a leader that misses committed data), so
# a partial set is refused with the way out.
format_cluster() {
  local n have=() missing=()
  for n in "${NODES[@]}"; do
    if [[ -f "$C_DIR/node-$n/data/meta.properties" ]]; then have+=("$n"); else missing+=("$n"); fi
  done
  if ((${#missing[@]} == 0)); then
    local was
    was="$(cat "$C_DIR/formatted.controller-ports" 2>/dev/null || true)"
    if [[ -n "$was" && "$was" != "${C_CONTROLLER_PORTS[*]}" ]]; then
      LABEL=kafka die "the cluster was formatted with controller ports '$was', now '${C_CONTROLLER_PORTS[*]}' (BANDPLANE_KAFKA_CLUSTER_CONTROLLER_PORTS); the quorum's endpoints are in its metadata log: use the old ports, or stop the cluster and remove $C_DIR to start from empty"
    fi
    return 0
  fi
  if ((${#have[@]} > 0)); then
    LABEL=kafka die "node(s) ${missing[*]} have no storage but node(s) ${have[*]} do; a controller cannot rejoin the quorum with an empty metadata log. Stop the cluster (kafka.sh --brokers 3 stop) and remove $C_DIR to start from empty"
  fi
  mkdir -p "$C_DIR"
  local id ic="" dir
  use_node 1
  if [[ -s "$CLUSTER_ID_FILE" ]]; then id="$(cat "$CLUSTER_ID_FILE")"; else id="$(random_uuid)"; echo "$id" >"$CLUSTER_ID_FILE"; fi
  for n in "${NODES[@]}"; do
    dir="$(random_uuid)"
    ic+="${ic:+,}$n@127.0.0.1:${C_CONTROLLER_PORTS[$n - 1]}:$dir"
  done
  for n in "${NODES[@]}"; do
    use_node "$n"
    render_config
    say "formatting $DATA_DIR (cluster id $id, voters $ic)"
    if ! kafka_java kafka.tools.StorageTool format -t "$id" -c "$PROPS" --initial-controllers "$ic" >>"$LOG_DIR/format.log" 2>&1; then
      tail -n 30 "$LOG_DIR/format.log" >&2
      for n in "${NODES[@]}"; do rm -rf "$C_DIR/node-$n/data"; done
      die "kafka-storage format failed (see $LOG_DIR/format.log); no node is formatted"
    fi
  done
  echo "${C_CONTROLLER_PORTS[*]}" >"$C_DIR/formatted.controller-ports"
}

log_tail() {
  local f
  for f in "$LOG_DIR/server.log" "$LOG_DIR/stdout.log"; do
    if [[ -s "$f" ]]; then
      echo "$LABEL: ---- last 30 lines of $f ----" >&2
      tail -n 30 "$f" >&2
    fi
  done
}

file_size() { stat -c %s "$1" 2>/dev/null || echo 0; }

# Launches the broker of the current settings and sets LAUNCHED_PID.
launch() {
  rm -f "$PID_FILE"
  # setsid: own session and process group, so a terminal's Ctrl-C or a wrapper's process
  # group kill does not reach the broker. setsid forks when the caller leads a process
  # group, so $! is not reliable: the launched shell writes its own pid, then execs the JVM.
  # shellcheck disable=SC2016,SC2086
  setsid bash -c 'echo $$ >"$1"; cd "$2"; shift 2; exec nohup "$@"' kafka-launch "$PID_FILE" "$K_DIR" \
    java $HEAP ${JVM_EXTRA[@]+"${JVM_EXTRA[@]}"} -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HERE/kafka/log4j2.xml" -Dkafka.logs.dir="$LOG_DIR" \
    -cp "$LIB/*" kafka.Kafka "$PROPS" </dev/null >>"$LOG_DIR/stdout.log" 2>&1 &
  local i
  for i in $(seq 1 50); do
    [[ -s "$PID_FILE" ]] && break
    sleep 0.1
  done
  LAUNCHED_PID="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ -n "$LAUNCHED_PID" ]] || die "launcher wrote no pid file"
  # Give exec a moment, so the command line check in our_pid sees the JVM.
  for i in $(seq 1 20); do
    is_running && break
    sleep 0.1
  done
}

# Says whether the broker logged its start since byte offset $1 of server.log and
# accepts connections. "Kafka Server started" comes after the broker registered with the
# controller, caught up with the metadata log and was unfenced.
started_since() {
  local log="$LOG_DIR/server.log" size from=$(($1 + 1))
  # Lines written since this start (the whole file if log4j rolled it meanwhile).
  size="$(file_size "$log")"
  ((size >= $1)) || from=1
  tail -c +"$from" "$log" 2>/dev/null | grep -q 'Kafka Server started' && port_open "$PORT"
}

# Kills a half-started launcher/JVM of ours (defensive: pid $1 may not be the JVM yet).
kill_half_started() {
  if kill -0 "$1" 2>/dev/null && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF "$PROPS"; then
    kill -KILL "$1" 2>/dev/null || true
  fi
  rm -f "$PID_FILE"
}

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
  local offset
  offset="$(file_size "$LOG_DIR/server.log")"
  say "starting broker (127.0.0.1:$PORT, controller 127.0.0.1:$CONTROLLER_PORT, state $K_DIR)"
  launch
  pid="$LAUNCHED_PID"

  local deadline=$((SECONDS + START_TIMEOUT)) ready=""
  while ((SECONDS < deadline)); do
    if ! is_running; then
      log_tail
      kill_half_started "$pid"
      die "broker exited during start-up"
    fi
    if started_since "$offset"; then
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

# Stops the broker of the current settings: TERM, up to STOP_TIMEOUT, then KILL.
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

# ---- --brokers 3 ----

# Starts the given nodes that are not running, together (a node alone cannot start: its
# controller needs a second voter for a quorum), and waits until each is started. On
# failure it stops the nodes it launched, so nothing is left that was not asked for.
cluster_start() {
  local t0=$EPOCHREALTIME n pid todo=()
  for n in "$@"; do
    use_node "$n"
    if pid="$(our_pid)"; then say "already running (pid $pid, 127.0.0.1:$PORT)"; else todo+=("$n"); fi
  done
  LABEL=kafka
  ((${#todo[@]} > 0)) || return 0
  ensure_java
  ensure_jars
  for n in "${todo[@]}"; do
    use_node "$n"
    for p in "$PORT" "$CONTROLLER_PORT"; do
      if port_open "$p"; then
        die "port 127.0.0.1:$p is already in use by another process (set BANDPLANE_KAFKA_CLUSTER_PORTS / BANDPLANE_KAFKA_CLUSTER_CONTROLLER_PORTS)"
      fi
    done
  done
  format_cluster
  local -A offset=() launched=()
  for n in "${todo[@]}"; do
    use_node "$n"
    render_config
    offset[$n]="$(file_size "$LOG_DIR/server.log")"
    say "starting (127.0.0.1:$PORT, controller 127.0.0.1:$CONTROLLER_PORT, state $K_DIR)"
    launch
    launched[$n]="$LAUNCHED_PID"
  done
  local deadline=$((SECONDS + START_TIMEOUT)) pending=("${todo[@]}") still failed=""
  while ((${#pending[@]} > 0 && SECONDS < deadline)); do
    still=()
    for n in "${pending[@]}"; do
      use_node "$n"
      if ! is_running; then
        log_tail
        kill_half_started "${launched[$n]}"
        failed="node-$n exited during start-up"
        break 2
      fi
      if started_since "${offset[$n]}"; then
        say "started (pid ${launched[$n]}) in $(elapsed "$t0")s"
      else
        still+=("$n")
      fi
    done
    pending=("${still[@]}")
    ((${#pending[@]} == 0)) || sleep 0.3
  done
  if [[ -z "$failed" && ${#pending[@]} -gt 0 ]]; then
    for n in "${pending[@]}"; do use_node "$n"; log_tail; done
    failed="node(s) ${pending[*]} not started within ${START_TIMEOUT}s"
  fi
  if [[ -n "$failed" ]]; then
    cluster_stop "${todo[@]}" >/dev/null 2>&1 || true
    LABEL=kafka die "$failed (the nodes this command launched are stopped again)"
  fi
  LABEL=kafka
  say "cluster of 3 running (Kafka $KAFKA_VERSION, $(elapsed "$t0")s)"
  say "  bootstrap servers $C_BOOTSTRAP (PLAINTEXT), controllers $C_CONTROLLERS"
  say "  state $C_DIR/node-{1,2,3} (logs in log/server.log, JVM output log/stdout.log)"
}

# Stops the given nodes together: TERM to all, up to STOP_TIMEOUT, then KILL. Together,
# because a node shutting down alone after the others asks a controller quorum that no
# longer exists to move its partitions away.
cluster_stop() {
  local n pid pids=() any=""
  for n in "$@"; do
    use_node "$n"
    if pid="$(our_pid)"; then
      say "stopping (pid $pid) ..."
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$n:$pid")
      any=1
    elif [[ -f "$PID_FILE" ]]; then
      say "not running (removing stale pid file)"
      rm -f "$PID_FILE"
    else
      say "not running"
    fi
  done
  [[ -n "$any" ]] || return 0
  local deadline=$((SECONDS + STOP_TIMEOUT)) e alive
  while ((SECONDS < deadline)); do
    alive=""
    for e in "${pids[@]}"; do kill -0 "${e#*:}" 2>/dev/null && alive=1; done
    [[ -n "$alive" ]] || break
    sleep 0.2
  done
  for e in "${pids[@]}"; do
    use_node "${e%%:*}"
    pid="${e#*:}"
    if kill -0 "$pid" 2>/dev/null; then
      say "still running after ${STOP_TIMEOUT}s, sending KILL"
      kill -KILL "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
    fi
    rm -f "$PID_FILE"
    say "stopped"
  done
}

cluster_status() {
  local n pid rc=0 up=0
  for n in "${NODES[@]}"; do
    use_node "$n"
    if pid="$(our_pid)"; then
      if port_open "$PORT"; then
        say "running (pid $pid, 127.0.0.1:$PORT, controller 127.0.0.1:$CONTROLLER_PORT)"
        up=$((up + 1))
        continue
      fi
      say "process $pid is alive but 127.0.0.1:$PORT is not accepting connections"
    else
      say "not running"
    fi
    rc=3
  done
  LABEL=kafka
  if ((up == 3)); then
    say "cluster of 3 running, bootstrap servers $C_BOOTSTRAP"
  elif ((up == 2)); then
    say "2 of 3 nodes running (the cluster works: quorum and min.insync.replicas=2 are met)"
  elif ((up == 1)); then
    say "1 of 3 nodes running (no controller quorum: the cluster is unavailable)"
  fi
  return "$rc"
}

node_arg() {
  local n="${ARGS[1]:-}"
  [[ "$n" == 1 || "$n" == 2 || "$n" == 3 ]] || die "$CMD needs a node number 1, 2 or 3, got '${n}'"
  echo "$n"
}

cluster_kill_node() {
  use_node "$1"
  local pid
  if ! pid="$(our_pid)"; then
    rm -f "$PID_FILE"
    say "not running (nothing to kill)"
    return 0
  fi
  kill -KILL "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$PID_FILE"
  say "killed (SIGKILL, pid $pid)"
}

cluster_start_node() {
  local other up=0
  for other in "${NODES[@]}"; do
    [[ "$other" == "$1" ]] && continue
    use_node "$other"
    is_running && up=$((up + 1))
  done
  use_node "$1"
  if is_running; then say "already running (pid $(our_pid), 127.0.0.1:$PORT)"; return 0; fi
  ((up > 0)) || die "no other node is running: one node alone has no controller quorum; start the set with \`kafka.sh --brokers 3 start\`"
  cluster_start "$1"
}

if [[ "$BROKERS" == 1 ]]; then
  case "$CMD" in
    start) do_start ;;
    stop) do_stop ;;
    restart) do_stop; do_start ;;
    status) rc=0; do_status || rc=$?; exit "$rc" ;;
    kill-node | start-node) die "$CMD is for the three-node cluster: kafka.sh --brokers 3 $CMD N" ;;
    *) usage ;;
  esac
else
  case "$CMD" in
    start) cluster_start "${NODES[@]}" ;;
    stop) cluster_stop "${NODES[@]}" ;;
    restart) cluster_stop "${NODES[@]}"; cluster_start "${NODES[@]}" ;;
    status) rc=0; cluster_status || rc=$?; exit "$rc" ;;
    kill-node) n="$(node_arg)"; cluster_kill_node "$n" ;;
    start-node) n="$(node_arg)"; cluster_start_node "$n" ;;
    *) usage ;;
  esac
fi
