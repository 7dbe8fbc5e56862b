#!/bin/sh
# Entrypoint of the bandplane image. bandplane reads its ClickHouse password from the
# environment only (BANDPLANE_CLICKHOUSE_PASSWORD); Compose hands secrets over as files,
# so CLICKHOUSE_PASSWORD_FILE names one to read it from. Kubernetes sets the variable
# from a Secret itself and leaves CLICKHOUSE_PASSWORD_FILE unset.
#
# `docker-entrypoint.sh serve …` runs bandplane; an absolute path as the first argument
# (`/bin/sh /opt/bandplane/bootstrap-keys.sh`) runs that instead, with the same
# environment.
set -eu
if [ -n "${CLICKHOUSE_PASSWORD_FILE:-}" ]; then
	BANDPLANE_CLICKHOUSE_PASSWORD="$(cat "$CLICKHOUSE_PASSWORD_FILE")"
	export BANDPLANE_CLICKHOUSE_PASSWORD
fi
case "${1:-}" in
/*) exec "$@" ;;
esac
exec /usr/local/bin/bandplane "$@"
