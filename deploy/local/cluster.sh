#!/usr/bin/env bash
# A local ClickHouse cluster for bandplane's cluster tests and for trying `--cluster`:
# ZooKeeper (Debian's `zookeeper` package, one standalone server) and four ClickHouse
# 18.16 servers as 2 shards x 2 replicas, cluster name `bandplane`, loopback only, state
# under $BANDPLANE_STATE/cluster (default <repo>/.local/cluster).
#
#   deploy/local/cluster.sh up|down|status
#   deploy/local/cluster.sh reset          stop it and delete its state (every database on it)
#   deploy/local/cluster.sh kill-node N    SIGKILL ClickHouse node N (1-4), for tests
#   deploy/local/cluster.sh start-node N   start node N again (it catches up from its peer)
#
# Nodes (shard, replica): 1 = (01, ch1), 2 = (01, ch2), 3 = (02, ch3), 4 = (02, ch4).
# Node N listens on native 2900N, HTTP 2812N and replication (interserver HTTP) 2813N;
# ZooKeeper on 22181. Each node is started by clickhouse.sh with its own state folder
# and a config.d/users.d rendered here (deploy/local/cluster/*.xml).
#
# Environment:
#   BANDPLANE_STATE               state folder (default: <repo root>/.local)
#   BANDPLANE_ZK_PORT             ZooKeeper client port (default 22181)
#   BANDPLANE_ZK_HEAP             ZooKeeper JVM heap options (default "-Xms64m -Xmx256m")
#
# `status` exits 0 when ZooKeeper and all four nodes run, 3 otherwise. `up` and `down`
# are idempotent: `up` starts what is not running, `down` stops what runs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STATE="${BANDPLANE_STATE:-$ROOT/.local}"
mkdir -p "$STATE"
STATE="$(cd "$STATE" && pwd)"
C_DIR="$STATE/cluster"
ZK_DIR="$C_DIR/zookeeper"
ZK_PORT="${BANDPLANE_ZK_PORT:-22181}"
ZK_HEAP="${BANDPLANE_ZK_HEAP:--Xms64m -Xmx256m}"
ZK_PID="$ZK_DIR/zookeeper.pid"
ZK_CFG="$ZK_DIR/zoo.cfg"
NODES=(1 2 3 4)

say() { echo "cluster: $*"; }
die() { echo "cluster: ERROR: $*" >&2; exit 1; }

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

zk_jar() { echo /usr/share/java/zookeeper.jar; }

ensure_zookeeper() {
  [[ -f "$(zk_jar)" ]] && return 0
  command -v apt-get >/dev/null || die "ZooKeeper missing and apt-get is unavailable; install Debian's zookeeper package by hand"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "ZooKeeper missing; run as root or install sudo"
    sudo=(sudo)
  fi
  say "installing Debian package zookeeper ..."
  if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then "${sudo[@]}" apt-get update -q; fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q zookeeper \
    || { "${sudo[@]}" apt-get update -q &&
         "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q zookeeper; } \
    || die "apt-get install zookeeper failed"
  [[ -f "$(zk_jar)" ]] || die "$(zk_jar) still missing after installing zookeeper"
}

zk_pid() {
  [[ -f "$ZK_PID" ]] || return 1
  local pid
  pid="$(tr -dc '0-9' <"$ZK_PID")"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$ZK_CFG" || return 1
  echo "$pid"
}

zk_ok() { [[ "$(timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ZK_PORT; printf ruok >&3; cat <&3" 2>/dev/null)" == imok ]]; }

zk_start() {
  local pid
  if pid="$(zk_pid)"; then say "zookeeper already running (pid $pid, 127.0.0.1:$ZK_PORT)"; return 0; fi
  ensure_zookeeper
  command -v java >/dev/null || die "java not found (kafka.sh installs openjdk-17-jre-headless)"
  port_open "$ZK_PORT" && die "port 127.0.0.1:$ZK_PORT is in use by another process (set BANDPLANE_ZK_PORT)"
  mkdir -p "$ZK_DIR/data" "$ZK_DIR/log"
  sed -e "s#@DATA_DIR@#$ZK_DIR/data#g" -e "s#@PORT@#$ZK_PORT#g" "$HERE/cluster/zoo.cfg" >"$ZK_CFG"
  say "starting zookeeper (127.0.0.1:$ZK_PORT, state $ZK_DIR)"
  # shellcheck disable=SC2016,SC2086
  setsid bash -c 'echo $$ >"$1"; shift; exec nohup "$@"' zk-launch "$ZK_PID" \
    java $ZK_HEAP -Dzookeeper.log.dir="$ZK_DIR/log" -cp "$(zk_jar)" \
    org.apache.zookeeper.server.ZooKeeperServerMain "$ZK_CFG" </dev/null >>"$ZK_DIR/log/zookeeper.log" 2>&1 &
  local deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    zk_ok && { say "zookeeper ready (pid $(zk_pid || echo '?'))"; return 0; }
    sleep 0.3
  done
  tail -n 30 "$ZK_DIR/log/zookeeper.log" >&2 || true
  zk_stop >/dev/null 2>&1 || true
  die "zookeeper did not answer ruok on 127.0.0.1:$ZK_PORT within 60s"
}

zk_stop() {
  local pid
  if ! pid="$(zk_pid)"; then rm -f "$ZK_PID"; say "zookeeper not running"; return 0; fi
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 20))
  while zk_pid >/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  # Only a process that is still ours (the pid could be another's by now).
  if zk_pid >/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$ZK_PID"
  say "zookeeper stopped"
}

# node_env N: the environment clickhouse.sh runs node N with.
node_env() {
  local n=$1
  echo "BANDPLANE_STATE=$C_DIR/ch$n" "BANDPLANE_CH_PORT=2900$n" "BANDPLANE_CH_HTTP_PORT=2812$n" \
    "BANDPLANE_CH_CONF_DIR=$C_DIR/ch$n/conf"
}

render_node() {
  local n=$1 shard replica
  shard="0$(((n + 1) / 2))"
  replica="ch$n"
  mkdir -p "$C_DIR/ch$n/conf/config.d" "$C_DIR/ch$n/conf/users.d"
  sed -e "s#@SHARD@#$shard#g" -e "s#@REPLICA@#$replica#g" -e "s#@INTERSERVER_PORT@#2813$n#g" \
      -e "s#@ZK_PORT@#$ZK_PORT#g" "$HERE/cluster/config.xml" >"$C_DIR/ch$n/conf/config.d/cluster.xml"
  cp -f "$HERE/cluster/users.xml" "$C_DIR/ch$n/conf/users.d/cluster.xml"
}

check_node() {
  [[ "$1" =~ ^[1-4]$ ]] || die "node must be 1, 2, 3 or 4 (got '${1:-}')"
}

node() {
  local n=$1
  shift
  # shellcheck disable=SC2046
  env $(node_env "$n") "$HERE/clickhouse.sh" "$@" | sed -e "s/^clickhouse:/clickhouse ch$n:/"
  return "${PIPESTATUS[0]}"
}

node_start() {
  local n=$1
  render_node "$n"
  node "$n" start
}

node_kill() {
  local n=$1 pid f
  f="$C_DIR/ch$n/clickhouse/clickhouse-server.pid"
  pid="$(tr -dc '0-9' <"$f" 2>/dev/null || true)"
  if [[ -z "$pid" ]] || ! kill -0 "$pid" 2>/dev/null; then say "node $n is not running"; return 0; fi
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$C_DIR/ch$n/" || die "pid $pid is not node $n's server"
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  say "node $n (pid $pid) killed"
}

case "${1:-}" in
  up)
    zk_start
    for n in "${NODES[@]}"; do node_start "$n"; done
    say "cluster 'bandplane' up: shards 01 (127.0.0.1:29001, :29002) and 02 (127.0.0.1:29003, :29004), zookeeper 127.0.0.1:$ZK_PORT"
    ;;
  down)
    rc=0
    for n in "${NODES[@]}"; do node "$n" stop || rc=$?; done
    zk_stop || rc=$?
    exit "$rc"
    ;;
  status)
    rc=0
    if zk_pid >/dev/null && zk_ok; then say "zookeeper running (127.0.0.1:$ZK_PORT)"; else say "zookeeper not running"; rc=3; fi
    for n in "${NODES[@]}"; do node "$n" status || rc=3; done
    exit "$rc"
    ;;
  reset)
    "$0" down
    rm -rf "$C_DIR"
    say "cluster state $C_DIR removed"
    ;;
  kill-node) check_node "${2:-}"; node_kill "$2" ;;
  start-node) check_node "${2:-}"; zk_pid >/dev/null || die "zookeeper is not running (cluster.sh up)"; node_start "$2" ;;
  *)
    echo "usage: $0 up|down|status|reset|kill-node N|start-node N" >&2
    exit 2
    ;;
esac
