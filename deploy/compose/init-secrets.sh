#!/bin/sh
# Makes the secrets compose.yaml reads (deploy/compose/secrets/, ignored by git) unless
# they exist: random passwords for ClickHouse's bandplane user and Grafana's admin.
# Run it once before the first `docker compose up`.
#
# The folder is the operator's only (0700); the files in it are 0644 because Compose
# bind-mounts them as they are, and the containers read them as their own non-root users
# (bandplane 65532, Grafana 472), not as the file's owner.
set -eu
dir="$(cd "$(dirname "$0")" && pwd)/secrets"
mkdir -p "$dir"
chmod 0700 "$dir"
for name in clickhouse_password grafana_admin_password; do
	f="$dir/$name"
	if [ -s "$f" ]; then
		echo "init-secrets: $f kept"
		continue
	fi
	# 32 hex characters: nothing a shell, XML or a URL would need escaped.
	od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$f"
	chmod 0644 "$f"
	echo "init-secrets: made $f"
done
