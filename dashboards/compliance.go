package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// auditWhere is the compliance officer's selection: organization, actor, room, type,
// a text in the event's data, and the range.
var auditWhere = is("org_id", varOrg) + `
	  AND ` + is("actor_id", varActor) + `
	  AND ` + is("room_id", varRoom) + `
	  AND ` + is("type", varType) + `
	  AND ` + contains("data", varSearch) + `
	  AND ` + timeFilter("time")

// auditLimit bounds the trail table: a page for reading; `bandplane audit export` is the
// verifiable export of a whole range.
const auditLimit = 1000

var (
	auditTrailSQL = sql(`
	SELECT at, type, actor, ` + nameOr("room_name", "room_id") + ` AS room, subject, source, id, excerpt, actor_id, room_id
	FROM (
	  SELECT time, time_ms, at, type, actor, org_id, room_id,
	    if(subject_id = '', '', concat(subject_type, ' ',
	      multiIf(subject_name != '', subject_name, subject_handle != '', concat('@', subject_handle), subject_id))) AS subject,
	    source, id, excerpt, actor_id
	  FROM (
	    SELECT time, time_ms, at, type, multiIf(actor_name != '', actor_name, actor_handle != '', concat('@', actor_handle), actor_id) AS actor,
	      org_id, room_id, subject_id, subject_type, subject_handle, source, id, excerpt, actor_id
	    FROM (
	      SELECT time, time_ms, concat(toString(time, 'UTC'), '.', substring(toString(1000 + time_ms), 2, 3)) AS at, type,
	        actor_id, actor_handle, org_id, room_id, subject_id, subject_type, subject_handle,
	        source, id, substringUTF8(data, 1, 300) AS excerpt
	      FROM bandplane.events FINAL
	      WHERE ` + auditWhere + `
	      ORDER BY time DESC, time_ms DESC, id
	      LIMIT ` + itoa(auditLimit) + `
	    ) AS e
	    ANY LEFT JOIN ` + actorLookup + ` USING (actor_id)
	  ) AS with_actor
	  ANY LEFT JOIN ` + anyNameLookup("subject_id", "subject_name", "subject_names") + ` USING (subject_id)
	) AS named
	ANY LEFT JOIN ` + roomLookup + ` USING (room_id)
	ORDER BY time DESC, time_ms DESC, id`)

	auditByTypeSQL = sql(`
	SELECT ` + bucket("time") + ` AS bucket, type, count() AS events
	FROM bandplane.events FINAL
	WHERE ` + auditWhere + `
	GROUP BY bucket, type
	ORDER BY bucket, type`)

	// Each organization's transparency log as ClickHouse holds it (query/trail): its
	// newest checkpoint row (the largest size, then the latest signed_at), the leaves
	// its index holds, and its events not sealed yet (unsealedKeys). Driven by the
	// events and the checkpoints, so that an organization never sealed shows too, and
	// one whose events are gone. SQL cannot check an Ed25519 signature or a Merkle
	// proof, so every column is what ClickHouse says: a forged checkpoint row is shown as
	// the newest checkpoint. It cannot make events without a leaf look sealed (they are
	// counted from log_leaves), and one larger than the log is named in the status; that
	// a checkpoint verifies is `bandplane audit verify`'s to say.
	//
	// The reads without FINAL (unmerged) would otherwise merge the whole trail on every
	// refresh: which organizations have events needs no deduplication (GROUP BY org_id),
	// nor the largest index of a log (its leaves: the sealer appends without gaps), nor
	// the events not sealed yet (unsealedKeys).
	sealStatusSQL = sql(`
	SELECT if(org_id = '', '(no organization)', ` + nameOr("org_name", "org_id") + `) AS organization, status, size, leaves,
	  signed_at, age, unsealed_events, unsealed_age, key_id, org_id
	FROM (
	  SELECT org_id, head_size AS size, log_size AS leaves, unsealed_events,
	    if(checkpoint_rows = 0, NULL, head_signed_at) AS signed_at,
	    if(checkpoint_rows = 0, NULL, toInt64(now()) - toInt64(head_signed_at)) AS age,
	    if(unsealed_events = 0, NULL, toInt64(now()) - toInt64(oldest_unsealed)) AS unsealed_age,
	    if(checkpoint_rows = 0, NULL, head_key_id) AS key_id,
	    multiIf(checkpoint_rows = 0, 'never sealed',
	      head_size > log_size, concat('newest checkpoint claims ', toString(head_size), ' leaves, the log holds ', toString(log_size)),
	      unsealed_events = 0, 'sealed',
	      concat(toString(unsealed_events), ' events not sealed yet')) AS status
	  FROM (
	    SELECT org_id, head_size, head_signed_at, head_key_id, checkpoint_rows, log_size, unsealed_events, oldest_unsealed
	    FROM (
	      SELECT org_id, head_size, head_signed_at, head_key_id, checkpoint_rows, log_size
	      FROM (
	        SELECT org_id, head_size, head_signed_at, head_key_id, checkpoint_rows
	        FROM (
	          SELECT org_id
	          FROM (
	            SELECT org_id
	            FROM ` + unmerged("events", "which organizations have events") + `
	            WHERE ` + is("org_id", varOrg) + `
	            GROUP BY org_id
	            UNION ALL
	            SELECT org_id
	            FROM bandplane.checkpoints FINAL
	            WHERE ` + is("org_id", varOrg) + `
	            GROUP BY org_id
	          ) AS known
	          GROUP BY org_id
	        ) AS orgs
	        ANY LEFT JOIN ` + checkpointHeads(is("org_id", varOrg), "heads") + ` USING (org_id)
	      ) AS with_head
	      ANY LEFT JOIN (
	        SELECT org_id, max(idx) + 1 AS log_size
	        FROM ` + unmerged("log_index", "the largest index is the same over every stored row") + `
	        WHERE ` + is("org_id", varOrg) + `
	        GROUP BY org_id
	      ) AS logs USING (org_id)
	    ) AS with_log
	    ANY LEFT JOIN (
	      SELECT org_id, count() AS unsealed_events, min(ingested) AS oldest_unsealed
	      FROM ` + unsealedKeys(is("org_id", varOrg), sealWindow) + `
	      GROUP BY org_id
	    ) AS pending USING (org_id)
	  ) AS per_org
	) AS st
	ANY LEFT JOIN ` + orgLookup + ` USING (org_id)
	ORDER BY organization`)
)

// sealWindow bounds the events the seal status checks for a leaf to those ingested in
// the last day, which keeps the two sides of its join small: a healthy sealer seals a
// row within a minute or two, and the age of the newest checkpoint shows a sealer
// stopped for longer.
const sealWindow = "now() - INTERVAL 1 DAY"

// checkpointHeads is the newest checkpoint row of each organization orgFilter selects,
// as the subquery alias: head_size (the largest size), its head_signed_at and
// head_key_id (of the latest signed_at at that size), and checkpoint_rows.
func checkpointHeads(orgFilter, alias string) string {
	return `(
	  SELECT org_id, max(size) AS head_size, argMax(signed_at, (size, signed_at)) AS head_signed_at,
	    argMax(key_id, (size, signed_at)) AS head_key_id, count() AS checkpoint_rows
	  FROM bandplane.checkpoints FINAL
	  WHERE ` + orgFilter + `
	  GROUP BY org_id
	) AS ` + alias
}

// unsealedKeys is one row (org_id, time, id, ingested) per event key that orgFilter
// selects whose newest stored copy was ingested at or after since and is not sealed: no
// leaf of its key under the organization's newest checkpoint (idx below its size) was
// written at or after that copy. That is verify's test of a stored copy (a leaf of its
// key, no older than it) applied to the copy readers see, so a copy stored after its
// key's leaf is not sealed by it; a key with no leaf joins as the zero time, which
// every ingested_at is after.
//
// Neither side needs FINAL: a later copy of a key is a later insert with a newer
// ingested_at, so the newest ingested_at among a key's copies is the copy FINAL keeps,
// and the copies of a leaf's row are the same row. Nor do the leaves need more than the
// same bound: a leaf that seals a copy was written at or after it.
func unsealedKeys(orgFilter, since string) string {
	return `(
	  SELECT org_id, time, id, ingested
	  FROM (
	    SELECT org_id, time, id, max(ingested_at) AS ingested
	    FROM ` + unmerged("events", "the newest copy of a key is the one FINAL keeps") + `
	    WHERE ` + orgFilter + ` AND ingested_at >= ` + since + `
	    GROUP BY org_id, time, id
	  ) AS copies
	  ANY LEFT JOIN (
	    SELECT org_id, time, id, max(leaf_ingested_at) AS sealed_through
	    FROM (
	      SELECT org_id, time, id, idx, ingested_at AS leaf_ingested_at
	      FROM ` + unmerged("log_leaves", "copies of a leaf are the same row") + `
	      WHERE ` + orgFilter + ` AND ingested_at >= ` + since + `
	    ) AS leaves
	    ANY LEFT JOIN ` + checkpointHeads(orgFilter, "newest") + ` USING (org_id)
	    WHERE idx < head_size
	    GROUP BY org_id, time, id
	  ) AS sealed USING (org_id, time, id)
	  WHERE ingested > sealed_through
	) AS unsealed_keys`
}

// sealStatusDescription says what the seal status shows and what it cannot: it reads
// what ClickHouse holds and checks no signature.
const sealStatusDescription = "Each organization's transparency log as ClickHouse holds it: the newest checkpoint row (size in leaves, signed_at, its age, key_id), " +
	"the leaves its log holds, and the events ingested in the last 24 hours that are not sealed yet (no leaf under the newest checkpoint), with the age of the oldest. " +
	"Status: never sealed (no checkpoint), sealed, N events not sealed yet, or a newest checkpoint that claims more leaves than the log holds (forged, or the log truncated). " +
	"These columns are untrusted: SQL cannot check signatures or proofs, so a forged checkpoint row shows here as the newest checkpoint, with its size, time and key. " +
	"It cannot make events without a leaf look sealed, but forged leaves, or a forged checkpoint over leaves that are there, can. " +
	"`bandplane audit verify` is what checks the signatures and the proofs."

// ComplianceAudit is "bandplane — Compliance audit": the audit trail, searchable by
// actor, room, type, text and time, and how far each organization's trail is sealed.
func ComplianceAudit() *dashboard.DashboardBuilder {
	g := &grid{}
	d := newDashboard("bandplane — Compliance audit", ComplianceUID,
		"The audit trail (bandplane.events) and each organization's transparency log as ClickHouse holds it (bandplane.checkpoints, log_index, log_leaves): `bandplane audit verify` is what checks it.",
		[]string{"compliance"}, "now-24h").
		WithVariable(orgVariable()).
		WithVariable(actorVariable()).
		WithVariable(roomVariable()).
		WithVariable(typeVariable()).
		WithVariable(searchVariable())

	d = d.WithPanel(tablePanel(g, 24, 6, "Latest seal per organization", sealStatusDescription, sealStatusSQL).
		OverrideByName("age", unitOf("s")).
		OverrideByName("unsealed_age", unitOf("s")).
		OverrideByName("org_id", hidden()))
	d = d.WithPanel(timeSeriesPanel(g, 24, 7, "Events by type", "The selected trail per interval and type.",
		auditByTypeSQL, "short", "${__field.labels.type}", "1m", true))
	d = d.WithPanel(tablePanel(g, 24, 16, "Audit trail",
		"The newest "+itoa(auditLimit)+" events of the selection (UTC, to the millisecond), each once. For a complete, verifiable export use `bandplane audit export`.",
		auditTrailSQL).
		OverrideByName("actor_id", hidden()).
		OverrideByName("room_id", hidden()).
		OverrideByName("room", cellLink("Work in ${__data.fields.room}", roomLink("room_id"))))
	return d
}
