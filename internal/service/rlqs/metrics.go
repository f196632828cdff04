package rlqs

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Actions of tokengate_rls_rlqs_assignments_total.
const (
	actTokenBucket = iota // a token-bucket share
	actDenyAll            // a share of nothing: no tokens to give now
	actAllowAll           // a bucket no rule applies to
	actExpire             // TTL 0 on shutdown
	numActs
)

var actNames = [numActs]string{"token_bucket", "deny_all", "allow_all", "expire"}

// Metrics are the RLQS server's Prometheus series, registered beside the
// RLS ones (docs/rlqs.md#metrics). All are resolved when made: counting
// is an atomic add.
type Metrics struct {
	streams, assigned       prometheus.Gauge
	reports, shares, errors prometheus.Counter
	abandons                prometheus.Counter
	calls, clamped, domains prometheus.Counter
	assignments             [numActs]prometheus.Counter
}

// NewMetrics returns the RLQS metrics registered in reg (nil: made but
// registered nowhere).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tokengate_rls_rlqs_streams_open",
			Help: "RLQS streams open (one per Envoy process and domain)."}),
		assigned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tokengate_rls_rlqs_buckets_assigned",
			Help: "Buckets of the open streams holding an assignment (a token-bucket share or a deny-all)."}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_rlqs_reports_total",
			Help: "Bucket usage reports received: one per bucket per report message (the first is the bucket's subscription)."}),
		shares: prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_rlqs_share_requests_total",
			Help: "Share requests sent to Redis (one per reported bucket that has a rule): debits of the rule's bucket and releases."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_rlqs_debit_errors_total",
			Help: "Share requests that failed in Redis: the Envoy was sent nothing new and keeps its assignment until its TTL."}),
		abandons: prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_rlqs_abandons_total",
			Help: "Abandon actions sent: a bucket idle for 3 report intervals and 10 s, its share released."}),
		calls: prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_rlqs_share_calls_total",
			Help: "Share script calls sent to Redis: one per bucket per flush, whatever the number of Envoys reporting it."}),
		clamped: prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_rlqs_reports_clamped_total",
			Help: "Bucket usage reports claiming more requests than their interval can hold (burst + 2 x rate x interval), counted as that."}),
		domains: prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_rlqs_domain_refused_total",
			Help: "Streams ended because their domain is not the one served (settings.rls.domain)."}),
	}
	av := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_rlqs_assignments_total",
		Help: "Quota assignments sent, by action: token_bucket (a share), deny_all (no tokens to give now), allow_all (no rule for the bucket), expire (TTL 0 on shutdown)."},
		[]string{"action"})
	for i := range m.assignments {
		m.assignments[i] = av.WithLabelValues(actNames[i])
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.streams, m.assigned, m.reports, m.shares, m.errors, m.abandons, m.calls, m.clamped, m.domains, av} {
			reg.MustRegister(c)
		}
	}
	return m
}
