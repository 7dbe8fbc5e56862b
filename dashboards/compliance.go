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

	// The latest seal of each organization's chain (ingest/seal): two sealers may both
	// write seal n+1 (a fork; both are kept), so the latest is the highest seq, then the
	// latest sealed_at. through is the ingest watermark: every event row ingested before
	// it is sealed, so the rows ingested at or after it are not sealed yet. Driven by the
	// events so that an organization never sealed shows too. Whether the chain verifies
	// (signatures, digests) is `bandplane audit verify`'s to say: SQL cannot check Ed25519.
	//
	// events is read without FINAL, which would merge the whole trail on every refresh:
	//   - which organizations have events needs no deduplication (GROUP BY org_id);
	//   - the events not sealed yet are the distinct keys (time, id) of an organization
	//     (the table's key is org_id, time, id) with a row ingested at or after its
	//     watermark: uniqExact counts a key stored twice once. That is the count of events
	//     FINAL: ingest stores a key again only as a later insert with the same content and
	//     a newer ingested_at, and FINAL keeps the last insert, so the kept row is at or
	//     after the watermark exactly when some row of the key is.
	// Only rows that can count are read: ingested_at at or after the oldest watermark of
	// the selected organizations, and every row of an organization never sealed.
	sealStatusSQL = sql(`
	SELECT if(org_id = '', '(no organization)', ` + nameOr("org_name", "org_id") + `) AS organization, status, last_seq,
	  sealed, age, watermark, sealed_events, seals, unsealed_events, org_id
	FROM (
	  SELECT org_id, last_seq, sealed_events, seals, unsealed_events,
	    if(seals = 0, NULL, sealed_at) AS sealed, if(seals = 0, NULL, through) AS watermark,
	    if(seals = 0, NULL, toInt64(now()) - toInt64(sealed_at)) AS age,
	    multiIf(seals = 0, 'never sealed', unsealed_events = 0, 'sealed', concat(toString(unsealed_events), ' events not sealed yet')) AS status
	  FROM (
	    SELECT org_id, last_seq, last_sealed_at AS sealed_at, last_through AS through, last_events AS sealed_events,
	      seal_count AS seals, unsealed_events
	    FROM (
	      SELECT org_id, last_seq, last_sealed_at, last_through, last_events, seal_count
	      FROM (
	        SELECT org_id
	        FROM ` + unmerged("events", "which organizations have events") + `
	        WHERE ` + is("org_id", varOrg) + `
	        GROUP BY org_id
	      ) AS orgs
	      ANY LEFT JOIN ` + sealHeads("heads") + ` USING (org_id)
	    ) AS with_seal
	    ANY LEFT JOIN (
	      SELECT org_id, uniqExact(time, id) AS unsealed_events
	      FROM (
	        SELECT org_id, time, id, ingested_at
	        FROM ` + unmerged("events", "uniqExact counts each key once") + `
	        WHERE ` + is("org_id", varOrg) + `
	          AND (ingested_at >= (SELECT min(last_through) FROM ` + sealHeads("oldest") + `)
	            OR org_id NOT IN (SELECT org_id FROM bandplane.seals FINAL WHERE ` + is("org_id", varOrg) + `))
	      ) AS recent
	      ANY LEFT JOIN ` + sealHeads("marks") + ` USING (org_id)
	      WHERE ingested_at >= last_through
	      GROUP BY org_id
	    ) AS unsealed USING (org_id)
	  ) AS per_org
	) AS st
	ANY LEFT JOIN ` + orgLookup + ` USING (org_id)
	ORDER BY organization`)
)

// sealHeads is the newest seal of each selected organization's chain, as the subquery
// alias: its seq, sealed_at, through (last_through), events and the number of seals.
func sealHeads(alias string) string {
	return `(
	        SELECT org_id, max(seq) AS last_seq, argMax(sealed_at, (seq, sealed_at)) AS last_sealed_at,
	          argMax(through, (seq, sealed_at)) AS last_through, argMax(events, (seq, sealed_at)) AS last_events,
	          count() AS seal_count
	        FROM bandplane.seals FINAL
	        WHERE ` + is("org_id", varOrg) + `
	        GROUP BY org_id
	      ) AS ` + alias
}

// ComplianceAudit is "bandplane — Compliance audit": the audit trail, searchable by
// actor, room, type, text and time, and how far each organization's trail is sealed.
func ComplianceAudit() *dashboard.DashboardBuilder {
	g := &grid{}
	d := newDashboard("bandplane — Compliance audit", ComplianceUID,
		"The audit trail (bandplane.events) with the seals of its tamper-evident chain (bandplane.seals).",
		[]string{"compliance"}, "now-24h").
		WithVariable(orgVariable()).
		WithVariable(actorVariable()).
		WithVariable(roomVariable()).
		WithVariable(typeVariable()).
		WithVariable(searchVariable())

	d = d.WithPanel(tablePanel(g, 24, 6, "Latest seal per organization",
		"Each organization's newest seal: its sequence number, when it was made, its watermark (every event ingested before it is sealed), and how many events arrived after it. `bandplane audit verify` checks the signatures and digests.",
		sealStatusSQL).
		OverrideByName("age", unitOf("s")).
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
