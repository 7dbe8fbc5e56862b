package ingest

import "github.com/prometheus/client_golang/prometheus"

// Metrics are ingest's Prometheus metrics. They are created against the registry that
// cmd/ builds and passes in; nothing registers globally.
type Metrics struct {
	Records         *prometheus.CounterVec // result: stored | dead_letter | replayed
	DeadLetters     *prometheus.CounterVec // stage: decode | validate | enrich | store
	Batches         prometheus.Counter
	BatchRows       prometheus.Histogram
	FlushSeconds    prometheus.Histogram
	StoreErrors     prometheus.Counter
	DLQErrors       prometheus.Counter
	NoteErrors      prometheus.Counter
	FetchErrors     prometheus.Counter
	CommitErrors    prometheus.Counter
	Unpriced        prometheus.Counter
	Unattributed    prometheus.Counter
	Lag             prometheus.Gauge
	RollupErrors    prometheus.Counter
	Repriced        prometheus.Counter
	CollectorLines  *prometheus.CounterVec // result: accepted | rejected
	CollectorErrors prometheus.Counter
	OTLPSpans       *prometheus.CounterVec // result: accepted | unbound | rejected | skipped

	InsertRejections     prometheus.Counter
	IDReused             prometheus.Counter
	LookupErrors         prometheus.Counter
	DeadLettersTruncated prometheus.Counter
	Dropped              prometheus.Counter
	Forgotten            *prometheus.CounterVec // set: late | unpriced
	Remembered           *prometheus.GaugeVec   // set: late | unpriced
	Batching             prometheus.Gauge
	Links                *prometheus.CounterVec // link: explicit | inferred | pending | resolved
}

// NewMetrics creates and registers the metrics; reg may be nil (tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Records: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bandplane_ingest_records_total",
			Help: "Kafka records handled by ingest, by result."}, []string{"result"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bandplane_ingest_dead_letters_total",
			Help: "Records sent to the dead-letter topic and table, by the stage that refused them."}, []string{"stage"}),
		Batches: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_batches_total",
			Help: "Batches written to ClickHouse and committed."}),
		BatchRows: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "bandplane_ingest_batch_records",
			Help: "Records per flushed batch.", Buckets: prometheus.ExponentialBuckets(1, 4, 10)}),
		FlushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "bandplane_ingest_flush_seconds",
			Help: "Time to write a batch to ClickHouse and commit it, retries included.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		StoreErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_clickhouse_errors_total",
			Help: "Failed ClickHouse writes (each is retried)."}),
		DLQErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_dead_letter_produce_errors_total",
			Help: "Failed writes to the dead-letter topic (each is retried)."}),
		FetchErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_kafka_fetch_errors_total",
			Help: "Failed Kafka fetches (each is retried)."}),
		CommitErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_kafka_commit_errors_total",
			Help: "Failed offset commits (the records are redelivered and deduplicated)."}),
		Unpriced: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_unpriced_usage_total",
			Help: "Usage events stored without a price (unknown model)."}),
		Unattributed: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_unattributed_events_total",
			Help: "Events stored without an organization (actor not in the directory yet)."}),
		Lag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "bandplane_ingest_consumer_lag",
			Help: "Records in the topic not yet committed by the ingest group."}),
		RollupErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_rollup_errors_total",
			Help: "Failed hourly rollup rebuilds (retried on the next tick)."}),
		Repriced: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_repriced_total",
			Help: "Usage facts whose cost was recomputed."}),
		CollectorLines: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bandplane_collector_lines_total",
			Help: "Lines received by POST /v1/events, by result."}, []string{"result"}),
		CollectorErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_collector_produce_errors_total",
			Help: "Collector requests that failed to produce to Kafka."}),
		OTLPSpans: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bandplane_otlp_spans_total",
			Help: "Spans received over OTLP, by result (accepted; unbound: accepted and stored unattributed, no binding names the sender; rejected; skipped: no GenAI operation or usage)."}, []string{"result"}),
		InsertRejections: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_insert_rejections_total",
			Help: "Inserts ClickHouse refused for their data (not retried: the batch is split to isolate the records it refuses)."}),
		IDReused: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_id_reused_total",
			Help: "Records dead-lettered because their event id is stored (or earlier in the batch) with other content."}),
		NoteErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_note_errors_total",
			Help: "Failed attempts to produce the notes of stored events to the stored-events topic (retried with back-off; the batch is committed only once they are in)."}),
		LookupErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_lookup_errors_total",
			Help: "Batches written without checking which events are stored, because ClickHouse refused the lookup for good."}),
		DeadLettersTruncated: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_dead_letters_truncated_total",
			Help: "Dead letters sent and stored with their raw record cut to fit the dead-letter message limit."}),
		Dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_ingest_dropped_total",
			Help: "Dead letters ClickHouse refused even without their raw record: logged at error level, not stored."}),
		Forgotten: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bandplane_ingest_forgotten_total",
			Help: "Entries of the consumer's memory dropped after their horizon, by set (late: parties with unattributed events; unpriced: agents with unpriced usage)."}, []string{"set"}),
		Remembered: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "bandplane_ingest_remembered",
			Help: "Entries in the consumer's memory, by set (late, unpriced), as of its last sweep."}, []string{"set"}),
		Batching: prometheus.NewGauge(prometheus.GaugeOpts{Name: "bandplane_ingest_batching_records",
			Help: "Records in the batch being built, not yet handed to the writer (a graceful stop flushes them)."}),
		Links: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bandplane_ingest_cause_links_total",
			Help: "Events given a cause link, by how it was made (explicit, inferred, pending on a trigger not seen yet); resolved counts the pending links a late trigger resolved."}, []string{"link"}),
	}
	if reg != nil {
		reg.MustRegister(m.Records, m.DeadLetters, m.Batches, m.BatchRows, m.FlushSeconds, m.StoreErrors, m.DLQErrors, m.NoteErrors,
			m.FetchErrors, m.CommitErrors, m.Unpriced, m.Unattributed, m.Lag, m.RollupErrors, m.Repriced,
			m.CollectorLines, m.CollectorErrors, m.OTLPSpans, m.InsertRejections, m.IDReused, m.LookupErrors, m.DeadLettersTruncated, m.Dropped,
			m.Forgotten, m.Remembered, m.Batching, m.Links)
	}
	return m
}
