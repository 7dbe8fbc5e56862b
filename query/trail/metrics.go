package trail

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	checkpoints prometheus.Counter
	leaves      prometheus.Counter
	errors      prometheus.Counter
	forged      prometheus.Counter
	badNotes    prometheus.Counter
	seconds     prometheus.Histogram
}

// newMetrics creates the sealer's metrics and registers them with reg (nil:
// unregistered); age and refused are read at each scrape.
func newMetrics(reg prometheus.Registerer, age, refused func() float64) *metrics {
	m := &metrics{
		checkpoints: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_audit_checkpoints_total",
			Help: "Checkpoints of new log sizes signed and stored."}),
		leaves: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_audit_sealed_events_total",
			Help: "Leaves appended to the organizations' logs (one per stored copy of an event row)."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_audit_seal_errors_total",
			Help: "Seal runs that failed (retried at the next run)."}),
		forged: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_audit_forged_checkpoints_total",
			Help: "Rows of the checkpoints table the sealer found that do not verify with its key ring (never used as a head)."}),
		badNotes: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_audit_bad_notes_total",
			Help: "Messages of the stored-events topic that are not notes ingest writes (skipped)."}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "bandplane_audit_seal_seconds",
			Help: "Duration of a seal run.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
	}
	if reg != nil {
		reg.MustRegister(m.checkpoints, m.leaves, m.errors, m.forged, m.badNotes, m.seconds,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bandplane_audit_unsealed_age_seconds",
				Help: "At most the age of the oldest unsealed event: seconds since the start of the last seal run that sealed every note produced before it (grows while sealing fails or an organization's log is refused)."}, age),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bandplane_audit_refused_orgs",
				Help: "Organizations whose log the sealer refuses to extend: ClickHouse's log was rolled back, forked or edited (audit verify names what)."}, refused),
		)
	}
	return m
}

func (m *metrics) observe(res Result, err error, d time.Duration) {
	m.checkpoints.Add(float64(res.Checkpoints))
	m.leaves.Add(float64(res.Leaves))
	m.seconds.Observe(d.Seconds())
	if err != nil {
		m.errors.Inc()
	}
}
