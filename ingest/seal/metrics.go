package seal

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	seals    prometheus.Counter
	events   prometheus.Counter
	errors   prometheus.Counter
	retries  prometheus.Counter
	seconds  prometheus.Histogram
	lastSeal prometheus.Gauge
}

// newMetrics creates the sealer's metrics and registers them with reg (nil: unregistered).
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		seals: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_audit_seals_total",
			Help: "Seals written to the audit trail's chains."}),
		events: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_audit_sealed_events_total",
			Help: "Event rows sealed."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_audit_seal_errors_total",
			Help: "Seal runs that failed, and audit.sealed events Kafka did not take (both retried at the next run)."}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "bandplane_audit_seal_retries_total",
			Help: "Times a seal run started over because another sealer sealed at the same time."}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "bandplane_audit_seal_seconds",
			Help: "Duration of a seal run.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		lastSeal: prometheus.NewGauge(prometheus.GaugeOpts{Name: "bandplane_audit_last_seal_through_seconds",
			Help: "The watermark (through) of the latest seal written by this process, Unix seconds."}),
	}
	if reg != nil {
		reg.MustRegister(m.seals, m.events, m.errors, m.retries, m.seconds, m.lastSeal)
	}
	return m
}

func (m *metrics) observe(res Result, err error, d time.Duration) {
	m.seals.Add(float64(res.Seals))
	m.events.Add(float64(res.Events))
	m.retries.Add(float64(res.Retries))
	m.seconds.Observe(d.Seconds())
	if err != nil {
		m.errors.Inc()
	}
	if !res.Through.IsZero() {
		m.lastSeal.Set(float64(res.Through.Unix()))
	}
}
