package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// eventsWhere selects the audit events of the chosen organization (no filter for "All")
// by event time, which leads the table's sort key.
var eventsWhere = is("org_id", varOrg) + `
	  AND ` + timeFilter("time")

// recentEvents bounds a read of the newest events to the partitions (toYYYYMMDD(time))
// of the last two days: freshness needs only the newest rows, and a pipeline with nothing
// newer is stale anyway (max() of nothing is 1970, which reads as stale, never as fresh).
const recentEvents = "time >= now() - INTERVAL 2 DAY"

// newestIngest is events read for max(ingested_at), without FINAL: FINAL only drops the
// extra copies of a key stored twice, a copy is a later insert with a newer ingested_at
// (and reached ClickHouse too), so the newest ingested_at of every stored row is the
// same answer, without merging two days of parts on every refresh.
var newestIngest = unmerged("events", "max of ingested_at is the same over every stored row")

var (
	eventsTotalSQL = sql(`
	SELECT count() AS events
	FROM bandplane.events FINAL
	WHERE ` + eventsWhere)

	// Freshness: seconds since the newest row reached ClickHouse. Kafka consumer lag is
	// not kept in ClickHouse (it is the Prometheus gauge bandplane_ingest_consumer_lag),
	// so this is the stand-in a dashboard of ClickHouse can show.
	freshnessSQL = sql(`
	SELECT toInt64(now()) - toInt64(max(ingested_at)) AS freshness
	FROM ` + newestIngest + `
	WHERE ` + is("org_id", varOrg) + ` AND ` + recentEvents)

	// The ingest rate is by insert time (ingested_at): what the pipeline wrote per second.
	ingestRateSQL = sql(`
	SELECT ` + bucket("ingested_at") + ` AS time, count() / ` + intervalS + ` AS events_per_second
	FROM bandplane.events FINAL
	WHERE ` + is("org_id", varOrg) + ` AND ` + timeFilter("ingested_at") + `
	GROUP BY time
	ORDER BY time`)

	eventsByTypeSQL = sql(`
	SELECT ` + bucket("time") + ` AS bucket, type, count() AS events
	FROM bandplane.events FINAL
	WHERE ` + eventsWhere + `
	GROUP BY bucket, type
	ORDER BY bucket, type`)

	// Seconds from an event's own time to its insert into ClickHouse: producer delay,
	// Kafka lag and batching together. toInt64 on both sides keeps a producer clock ahead
	// of ours a negative lag instead of a wrapped one, on every ClickHouse.
	ingestLagSQL = sql(`
	SELECT ` + bucket("time") + ` AS bucket,
	  quantile(0.5)(toInt64(ingested_at) - toInt64(time)) AS p50,
	  quantile(0.95)(toInt64(ingested_at) - toInt64(time)) AS p95,
	  max(toInt64(ingested_at) - toInt64(time)) AS max_lag
	FROM bandplane.events FINAL
	WHERE ` + eventsWhere + `
	GROUP BY bucket
	ORDER BY bucket`)

	// Dead letters carry no organization (they could not be decoded or validated), so
	// these panels ignore the org variable. FINAL: a redelivered record is one row.
	deadLettersTotalSQL = sql(`
	SELECT count() AS dead_letters
	FROM bandplane.dead_letters FINAL
	WHERE ` + timeFilter("received_at"))

	deadLettersByStageSQL = sql(`
	SELECT ` + bucket("received_at") + ` AS bucket, stage, count() AS dead_letters
	FROM bandplane.dead_letters FINAL
	WHERE ` + timeFilter("received_at") + `
	GROUP BY bucket, stage
	ORDER BY bucket, stage`)

	deadLetterReasonsSQL = sql(`
	SELECT
	  max(received_at) AS last_seen,
	  stage,
	  reason,
	  count() AS records,
	  argMax(concat(topic, '/', toString("partition"), '@', toString("offset")), received_at) AS last_record
	FROM bandplane.dead_letters FINAL
	WHERE ` + timeFilter("received_at") + `
	GROUP BY stage, reason
	ORDER BY last_seen DESC, stage, reason
	LIMIT 50`)
)

// PipelineHealth is "bandplane — Pipeline health": what the pipeline writes into
// ClickHouse, how fast and how late, and what it turns away into the dead-letter table.
func PipelineHealth() *dashboard.DashboardBuilder {
	one, sixty := 1.0, 60.0
	g := &grid{}
	d := newDashboard("bandplane — Pipeline health", IngestUID,
		"Events written to the audit trail (bandplane.events) and records turned away (bandplane.dead_letters).",
		[]string{"ingest"}, "now-6h").
		Refresh("1m").
		WithVariable(orgVariable())

	d = d.WithPanel(statPanel(g, 6, 5, "Events ingested", "Audit events in the range, by event time, each counted once.",
		eventsTotalSQL, "short"))
	d = d.WithPanel(statPanel(g, 6, 5, "Freshness",
		"Seconds since the newest event reached ClickHouse (now − max(ingested_at)). Kafka consumer lag is not stored in ClickHouse (it is the Prometheus gauge bandplane_ingest_consumer_lag of each serve): this is what ClickHouse can tell. A quiet platform also grows it; the alert rule fires above 60 s.",
		freshnessSQL, "s").
		Thresholds(thresholds(step("green", nil), step("red", &sixty))).
		ColorMode(common.BigValueColorModeBackground))
	d = d.WithPanel(statPanel(g, 6, 5, "Dead letters",
		"Records that could not be decoded, validated, enriched or stored, received in the range (all organizations: a dead letter has none).",
		deadLettersTotalSQL, "short").
		Thresholds(thresholds(step("green", nil), step("red", &one))).
		ColorMode(common.BigValueColorModeBackground))
	d = d.WithPanel(timeSeriesPanel(g, 6, 5, "Ingest rate", "Events written per second, by insert time (ingested_at).",
		ingestRateSQL, "wps", "", "1m", false))
	d = d.WithPanel(timeSeriesPanel(g, 12, 8, "Ingest lag",
		"Seconds from an event's time to its insert into ClickHouse, per interval (p50, p95, max): producer delay, Kafka and batching together.",
		ingestLagSQL, "s", "", "1m", false))
	d = d.WithPanel(timeSeriesPanel(g, 12, 8, "Events ingested per type", "Events per interval and type, by event time.",
		eventsByTypeSQL, "short", "${__field.labels.type}", "1m", true))
	d = d.WithPanel(timeSeriesPanel(g, 24, 8, "Dead letters by stage", "Dead letters per interval and stage (decode, validate, enrich, store).",
		deadLettersByStageSQL, "short", "${__field.labels.stage}", "1m", true))
	d = d.WithPanel(tablePanel(g, 24, 10, "Latest dead-letter reasons",
		"One row per stage and reason, most recent first; last_record is topic/partition@offset of the latest record.",
		deadLetterReasonsSQL))
	return d
}
