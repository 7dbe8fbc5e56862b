#!/usr/bin/env bash
# Local ClickHouse for bandplane development and CI: loopback only, non-default ports,
# config/data/logs under $BANDPLANE_STATE/clickhouse (default <repo>/.local/clickhouse).
#
#   deploy/local/clickhouse.sh start|stop|status|restart
#
# Environment:
#   BANDPLANE_STATE          state folder (default: <repo root>/.local)
#   BANDPLANE_CH_PORT        native TCP port (default 19000)
#   BANDPLANE_CH_HTTP_PORT   HTTP port (default 18123)
#   BANDPLANE_CH_START_TIMEOUT  seconds to wait for the server (default 60)
#   BANDPLANE_CH_CONF_DIR    a folder whose config.d/*.xml and users.d/*.xml are merged
#                            into the server's config (deploy/local/cluster.sh uses it for
#                            ZooKeeper, the cluster, macros and the replication port)
#
# `status` exits 0 when running, 3 when not. Installs the Debian packages
# clickhouse-server/clickhouse-client (18.16 on Debian 12) when no server binary is found.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STATE="${BANDPLANE_STATE:-$ROOT/.local}"
mkdir -p "$STATE"
STATE="$(cd "$STATE" && pwd)"
CH_DIR="$STATE/clickhouse"
ETC="$CH_DIR/etc"
LOG_DIR="$CH_DIR/log"
PID_FILE="$CH_DIR/clickhouse-server.pid"
CONFIG="$ETC/config.xml"
TCP_PORT="${BANDPLANE_CH_PORT:-19000}"
HTTP_PORT="${BANDPLANE_CH_HTTP_PORT:-18123}"
START_TIMEOUT="${BANDPLANE_CH_START_TIMEOUT:-60}"
CONF_DIR="${BANDPLANE_CH_CONF_DIR:-}"
STOP_TIMEOUT=30

say() { echo "clickhouse: $*"; }
die() { echo "clickhouse: ERROR: $*" >&2; exit 1; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

SERVER_CMD=()
CLIENT_CMD=()

find_binaries() {
  SERVER_CMD=()
  CLIENT_CMD=()
  local b
  for b in "$(command -v clickhouse-server 2>/dev/null || true)" /usr/bin/clickhouse-server /usr/sbin/clickhouse-server; do
    if [[ -n "$b" && -x "$b" ]]; then SERVER_CMD=("$b"); break; fi
  done
  for b in "$(command -v clickhouse-client 2>/dev/null || true)" /usr/bin/clickhouse-client; do
    if [[ -n "$b" && -x "$b" ]]; then CLIENT_CMD=("$b"); break; fi
  done
  # Upstream builds ship one multi-call binary `clickhouse`.
  local multi
  multi="$(command -v clickhouse 2>/dev/null || true)"
  if [[ -n "$multi" ]]; then
    [[ ${#SERVER_CMD[@]} -gt 0 ]] || SERVER_CMD=("$multi" server)
    [[ ${#CLIENT_CMD[@]} -gt 0 ]] || CLIENT_CMD=("$multi" client)
  fi
  [[ ${#SERVER_CMD[@]} -gt 0 && ${#CLIENT_CMD[@]} -gt 0 ]]
}

apt_lists_empty() {
  ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null
}

ensure_installed() {
  if find_binaries; then return 0; fi
  command -v apt-get >/dev/null || die "clickhouse-server not found and apt-get is unavailable; install ClickHouse by hand"
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "clickhouse-server not found; run as root or install sudo"
    sudo=(sudo)
  fi
  say "installing Debian packages clickhouse-server clickhouse-client ..."
  # The package's postinst would start a system-wide server on the default ports via
  # invoke-rc.d; forbid that with a temporary policy-rc.d unless one exists already.
  local own_policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${sudo[@]}" chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  local rc=0
  (
    export DEBIAN_FRONTEND=noninteractive
    if apt_lists_empty; then "${sudo[@]}" apt-get update -q; fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q clickhouse-server clickhouse-client \
      || { "${sudo[@]}" apt-get update -q &&
           "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q clickhouse-server clickhouse-client; }
  ) || rc=$?
  if [[ -n "$own_policy" ]]; then "${sudo[@]}" rm -f /usr/sbin/policy-rc.d; fi
  [[ $rc -eq 0 ]] || die "apt-get install clickhouse-server clickhouse-client failed (exit $rc)"
  find_binaries || die "clickhouse-server still not found after installing the packages"
}

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# Prints the pid if the pid file names a live clickhouse-server started with our config.
our_pid() {
  [[ -f "$PID_FILE" ]] || return 1
  local pid
  pid="$(tr -dc '0-9' <"$PID_FILE")"
  [[ -n "$pid" ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  local cmdline
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
  [[ "$cmdline" == *clickhouse* && "$cmdline" == *"$CONFIG"* ]] || return 1
  echo "$pid"
}

is_running() { our_pid >/dev/null; }

client() {
  "${CLIENT_CMD[@]}" --host 127.0.0.1 --port "$TCP_PORT" "$@"
}

render_config() {
  mkdir -p "$ETC" "$LOG_DIR" "$CH_DIR/data" "$CH_DIR/tmp" "$CH_DIR/user_files" "$CH_DIR/format_schemas"
  local tmp="$CONFIG.tmp.$$"
  sed -e "s#@STATE_DIR@#$CH_DIR#g" \
      -e "s#@TCP_PORT@#$TCP_PORT#g" \
      -e "s#@HTTP_PORT@#$HTTP_PORT#g" \
      "$HERE/clickhouse/config.xml" >"$tmp"
  mv -f "$tmp" "$CONFIG"
  cp -f "$HERE/clickhouse/users.xml" "$ETC/users.xml"
  # Extra config merged by the server (config.d/ beside config.xml, users.d/ beside
  # users.xml): replaced as a whole, so a file removed from CONF_DIR is gone too.
  local d
  for d in config.d users.d; do
    rm -rf "$ETC/$d"
    if [[ -n "$CONF_DIR" && -d "$CONF_DIR/$d" ]]; then
      mkdir -p "$ETC/$d"
      cp -f "$CONF_DIR/$d"/*.xml "$ETC/$d/"
    fi
  done
  # Empty substitutions file, so a system-wide /etc/metrika.xml is never read.
  [[ -f "$ETC/metrika.xml" ]] || echo '<yandex></yandex>' >"$ETC/metrika.xml"
}

log_tail() {
  local f
  for f in "$LOG_DIR/server.err.log" "$LOG_DIR/server.log" "$LOG_DIR/stderr.log"; do
    if [[ -s "$f" ]]; then
      echo "clickhouse: ---- last 30 lines of $f ----" >&2
      tail -n 30 "$f" >&2
    fi
  done
}

do_start() {
  local t0=$EPOCHREALTIME pid
  if pid="$(our_pid)"; then
    say "already running (pid $pid, tcp 127.0.0.1:$TCP_PORT)"
    return 0
  fi
  ensure_installed
  for p in "$TCP_PORT" "$HTTP_PORT"; do
    if port_open "$p"; then
      die "port 127.0.0.1:$p is already in use by another process (set BANDPLANE_CH_PORT / BANDPLANE_CH_HTTP_PORT)"
    fi
  done
  render_config
  rm -f "$PID_FILE"
  say "starting ${SERVER_CMD[*]} (tcp 127.0.0.1:$TCP_PORT, http 127.0.0.1:$HTTP_PORT, state $CH_DIR)"
  # 18.16 runs fine as root (no owner check of the data folder). --daemon double-forks,
  # chdirs to / and writes the pid file itself; stdout/stderr go to $LOG_DIR/std{out,err}.log.
  (cd "$CH_DIR" && "${SERVER_CMD[@]}" --daemon --pid-file="$PID_FILE" --config-file="$CONFIG" \
      </dev/null >>"$LOG_DIR/stdout.log" 2>>"$LOG_DIR/stderr.log") \
    || { log_tail; die "clickhouse-server --daemon failed"; }

  local deadline=$((SECONDS + START_TIMEOUT)) version=""
  while ((SECONDS < deadline)); do
    if version="$(client -q 'SELECT version()' 2>/dev/null)"; then
      break
    fi
    version=""
    # The daemon writes its pid file right after forking; if it died, stop waiting.
    if [[ -f "$PID_FILE" ]] && ! is_running; then
      sleep 0.5
      is_running || break
    fi
    sleep 0.3
  done
  if [[ -z "$version" ]]; then
    log_tail
    do_stop >/dev/null 2>&1 || true
    die "server did not answer on 127.0.0.1:$TCP_PORT within ${START_TIMEOUT}s"
  fi
  say "started ClickHouse $version (pid $(our_pid || echo '?')) in $(elapsed "$t0")s"
  say "  native tcp 127.0.0.1:$TCP_PORT, http 127.0.0.1:$HTTP_PORT, user 'default' without password"
  say "  logs $LOG_DIR/server.log and $LOG_DIR/server.err.log; data $CH_DIR/data"
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
    if port_open "$TCP_PORT"; then
      say "running (pid $pid, tcp 127.0.0.1:$TCP_PORT, http 127.0.0.1:$HTTP_PORT, logs $LOG_DIR)"
      return 0
    fi
    say "process $pid is alive but 127.0.0.1:$TCP_PORT is not accepting connections"
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
