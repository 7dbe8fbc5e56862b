#!/bin/sh
# One-shot key bootstrap of the Compose stack (service `keys`), after `migrate`.
# Idempotent: run it as often as you like.
#   - the audit key (Ed25519, `bandplane audit keygen`) in the bandplane-audit volume,
#     made once and never replaced: every checkpoint of the audit log is signed with it;
#   - the first admin key (platform, role admin) in the bandplane-admin volume, made
#     once, and again only when ClickHouse no longer has it active (revoked, or the
#     clickhouse-data volume was removed). Its token is printed nowhere: read it with
#       docker compose run --rm --no-deps keys /bin/cat /var/lib/bandplane/admin/admin.json
set -eu
umask 077
AUDIT=/var/lib/bandplane/audit/audit.key
ADMIN=/var/lib/bandplane/admin/admin.json

if [ -s "$AUDIT" ]; then
	echo "bootstrap: audit key $AUDIT kept"
else
	bandplane audit keygen --out "$AUDIT" >/dev/null
	echo "bootstrap: made the audit key $AUDIT (public half $AUDIT.pub)"
fi

if [ -s "$ADMIN" ]; then
	id=$(sed -n 's/.*"id":"\([^"]*\)".*/\1/p' "$ADMIN")
	# An active key is listed without revoked_at.
	if [ -n "$id" ] && bandplane keys list | grep -F "\"id\":\"$id\"" | grep -qv '"revoked_at"'; then
		echo "bootstrap: admin key $id kept"
		exit 0
	fi
	echo "bootstrap: admin key ${id:-?} is not active in ClickHouse any more; making a new one"
fi
bandplane keys create --org '*' --role admin --name "compose bootstrap admin" --by compose-bootstrap >"$ADMIN.tmp"
mv "$ADMIN.tmp" "$ADMIN"
echo "bootstrap: made admin key $(sed -n 's/.*"id":"\([^"]*\)".*/\1/p' "$ADMIN") in $ADMIN"
