package rls

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc/codes"

	"github.com/tokengate/tokengate/config"
)

// Decision codes counted per rule.
const (
	codeOK         = iota // the bucket had the tokens
	codeOver              // an enforced rule over its limit
	codeShadowOver        // a shadow rule over its limit (not enforced)
	codeError             // Redis failed for this descriptor
	numCodes
)

var codeNames = [numCodes]string{"ok", "over_limit", "shadow_over_limit", "error"}

// Request outcomes.
const (
	reqOK = iota
	reqOver
	reqUnavailable
	reqInvalid
	reqExhausted // refused by admission control (limits.go)
	numReqs
)

var reqNames = [numReqs]string{"ok", "over_limit", "unavailable", "invalid_argument", "resource_exhausted"}

// latencyBuckets are the upper bounds, in seconds, of the Redis round-trip
// and call histograms.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

// rlsMethod is the full gRPC method name of ShouldRateLimit.
const rlsMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// numGRPCCodes is the number of gRPC status codes (OK through
// Unauthenticated).
const numGRPCCodes = int(codes.Unauthenticated) + 1

// ruleCounters are one rule's pre-resolved counters: decisions and hits
// by decision code.
type ruleCounters struct {
	decisions, hits [numCodes]prometheus.Counter
	// quotaUsed is a quota rule's tokengate_rls_quota_used_ratio; nil
	// for other rules.
	quotaUsed prometheus.Observer
}

// callCounters are one gRPC method's pre-resolved counters by status code.
type callCounters struct {
	calls    [numGRPCCodes]prometheus.Counter
	duration [numGRPCCodes]prometheus.Observer
}

// Metrics are the service's Prometheus metrics, in a registry of their
// own (Registry) with the process and Go runtime collectors. Everything a
// call counts is resolved beforehand: a rule's counters when its
// configuration is installed (SetRules), the rest when the metrics are
// made; counting is an atomic add.
type Metrics struct {
	reg *prometheus.Registry

	decisionVec, hitsVec *prometheus.CounterVec
	rules                atomic.Pointer[map[*config.Rule]*ruleCounters]
	mu                   sync.Mutex               // serialises SetRules
	byName               map[string]*ruleCounters // every rule's counters, by name
	lastRules            []*config.Rule           // the last SetRules's rules

	requests  [numReqs]prometheus.Counter
	unmatched prometheus.Counter
	// quotaCrossedVec counts thresholds crossed first in a period, by rule
	// and threshold; quotaUsedVec observes the share of its limit a key has
	// used after each admitted quota decision, by rule.
	quotaCrossedVec *prometheus.CounterVec
	quotaUsedVec    *prometheus.HistogramVec
	refundErrors    prometheus.Counter

	redisErrors   *prometheus.CounterVec // cause, node
	redisDuration prometheus.Histogram

	callVec      *prometheus.CounterVec
	callDuration *prometheus.HistogramVec
	rlsCalls     *callCounters
	methods      sync.Map // full method name -> *callCounters, for the other methods
	inFlight     prometheus.Gauge

	tlsErrors prometheus.Counter
	trust     trustMetrics          // trust.go
	reloads   [2]prometheus.Counter // ok, error

	// detailed are the series of detailed_metric descriptors (a drop-in
	// configuration's): by rule and descriptor, at most detailedMax
	// descriptors, the others folded into their rule's overflow series.
	detailedVec, detailedHitsVec *prometheus.CounterVec
	detailedSeries               prometheus.Gauge
	detailedFolded               prometheus.Counter
	detailed                     sync.Map // detailedKey -> *ruleCounters
	detailedMu                   sync.Mutex
	detailedCount, detailedMax   int         // guarded by detailedMu
	detailedFull                 atomic.Bool // detailedCount has reached detailedMax

	// node is the node label of Redis errors that name none (the single
	// node of a plain Redis); errLog, when set, logs errors.
	node   atomic.Pointer[string]
	errLog atomic.Pointer[ErrorLog]
}

// NewMetrics returns zeroed metrics with counters for cfg's rules.
func NewMetrics(cfg *Config) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), byName: map[string]*ruleCounters{}}
	m.reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	f := func(c prometheus.Collector) { m.reg.MustRegister(c) }

	m.decisionVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_decisions_total",
		Help: "Descriptor decisions by rule and code."}, []string{"rule", "code"})
	m.hitsVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_hits_total",
		Help: "Descriptor decisions by rule and code, each weighted by the tokens it asked for (hits_addend, default 1; a lease grant: the tokens granted)."},
		[]string{"rule", "code"})
	f(m.decisionVec)
	f(m.hitsVec)

	reqVec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_requests_total",
		Help: "ShouldRateLimit calls by outcome (calls gRPC refused before the service saw them are in tokengate_rls_grpc_calls_total)."}, []string{"code"})
	f(reqVec)
	for i := range m.requests {
		m.requests[i] = reqVec.WithLabelValues(reqNames[i])
	}
	m.quotaCrossedVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_quota_threshold_crossed_total",
		Help: "Quota thresholds crossed for the first time in a period by a key, by rule and threshold (percent of the limit)."}, []string{"rule", "threshold"})
	m.quotaUsedVec = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tokengate_rls_quota_used_ratio",
		Help:    "The share of its limit a key had used after each admitted quota decision, by rule: near-quota keys are in the top buckets.",
		Buckets: quotaRatioBuckets}, []string{"rule"})
	f(m.quotaCrossedVec)
	f(m.quotaUsedVec)
	m.unmatched = prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_unmatched_descriptors_total",
		Help: "Descriptors no rule applies to (answered OK)."})
	m.refundErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_refund_errors_total",
		Help: "Refunds that failed: tokens stay taken for a rejected request."})
	m.redisErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_redis_errors_total",
		Help: "Pipelined Redis round trips with at least one failed command, by the first failure's cause and node."}, []string{"cause", "node"})
	m.redisDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tokengate_rls_redis_duration_seconds",
		Help: "Pipelined Redis round trips (one per request, plus one per refund).", Buckets: latencyBuckets})
	f(m.unmatched)
	f(m.refundErrors)
	m.trust = newTrustMetrics(f)
	f(m.redisErrors)
	f(m.redisDuration)

	m.callVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_grpc_calls_total",
		Help: "gRPC calls by method and status code, including those gRPC refused before the service saw them (a message above the size limit)."},
		[]string{"method", "code"})
	m.callDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tokengate_rls_grpc_call_duration_seconds",
		Help: "gRPC calls from their headers' arrival to their status's sending, by method and status code: a decision's whole time in the service.", Buckets: latencyBuckets},
		[]string{"method", "code"})
	m.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tokengate_rls_grpc_calls_in_flight",
		Help: "gRPC calls begun and not yet ended."})
	f(m.callVec)
	f(m.callDuration)
	f(m.inFlight)
	m.rlsCalls = m.methodCounters(rlsMethod)

	m.tlsErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_tls_handshake_errors_total",
		Help: "gRPC connections refused in the TLS handshake (no or an untrusted client certificate, no common protocol version)."})
	f(m.tlsErrors)
	reloadVec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_config_reloads_total",
		Help: "Reloads of the configuration file (SIGHUP or a change of the file) by result; on error the previous configuration stays."}, []string{"result"})
	f(reloadVec)
	m.reloads = [2]prometheus.Counter{reloadVec.WithLabelValues("ok"), reloadVec.WithLabelValues("error")}

	m.detailedVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_detailed_decisions_total",
		Help: "Decisions of detailed_metric descriptors by rule, descriptor (domain.key_value... as envoyproxy/ratelimit names its detailed stats) and code; descriptors past the cap are in descriptor=\"" + DetailedOverflow + "\"."},
		[]string{"rule", "descriptor", "code"})
	m.detailedHitsVec = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_detailed_hits_total",
		Help: "tokengate_rls_detailed_decisions_total, each decision weighted by the hits it asked for."},
		[]string{"rule", "descriptor", "code"})
	m.detailedSeries = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tokengate_rls_detailed_descriptors",
		Help: "Descriptors with detailed series of their own (at most the cap, TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS)."})
	m.detailedFolded = prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_detailed_overflow_total",
		Help: "Decisions of detailed_metric descriptors counted in their rule's overflow series because the cap on descriptors was reached."})
	f(m.detailedVec)
	f(m.detailedHitsVec)
	f(m.detailedSeries)
	f(m.detailedFolded)
	m.detailedMax = DefaultDetailedDescriptors

	m.SetRules(cfg)
	return m
}

// DefaultDetailedDescriptors is the default cap on the descriptors that
// get detailed series of their own (SetDetailedLimit).
const DefaultDetailedDescriptors = 1000

// DetailedOverflow is the descriptor label of the series that count, per
// rule, the detailed_metric decisions of the descriptors past the cap.
const DetailedOverflow = "_overflow"

// maxDetailedLabel bounds a descriptor label, in bytes: a longer one is
// cut (at a character boundary), so that a client sending long values
// cannot grow a series' memory either.
const maxDetailedLabel = 256

// SetDetailedLimit sets the cap on the descriptors that get series of
// their own in tokengate_rls_detailed_* (n < 0: the default). It holds for
// the process's life: series, once made, stay (as counters must); past the
// cap each rule's further descriptors share its overflow series. 0 puts
// every detailed decision in the overflow series.
func (m *Metrics) SetDetailedLimit(n int) {
	if n < 0 {
		n = DefaultDetailedDescriptors
	}
	m.detailedMu.Lock()
	m.detailedMax = n
	m.detailedFull.Store(m.detailedCount >= n)
	m.detailedMu.Unlock()
}

// detailedKey keys a descriptor's detailed counters.
type detailedKey struct{ rule, desc string }

// detailedCounters returns the counters of descriptor desc of rule r,
// making them if the cap allows, else r's overflow counters (and folded
// reports true).
func (m *Metrics) detailedCounters(r *config.Rule, desc string) (c *ruleCounters, folded bool) {
	k := detailedKey{r.Name, desc}
	if v, ok := m.detailed.Load(k); ok {
		return v.(*ruleCounters), false
	}
	if m.detailedFull.Load() { // spraying clients do not contend on the lock
		if v, ok := m.detailed.Load(detailedKey{r.Name, DetailedOverflow}); ok {
			return v.(*ruleCounters), true
		}
	}
	m.detailedMu.Lock()
	defer m.detailedMu.Unlock()
	if v, ok := m.detailed.Load(k); ok {
		return v.(*ruleCounters), false
	}
	if m.detailedCount >= m.detailedMax {
		m.detailedFull.Store(true)
		k.desc, folded = DetailedOverflow, true
		if v, ok := m.detailed.Load(k); ok {
			return v.(*ruleCounters), true
		}
	} else {
		m.detailedCount++
		m.detailedSeries.Set(float64(m.detailedCount))
	}
	c = new(ruleCounters)
	for code := range numCodes {
		c.decisions[code] = m.detailedVec.WithLabelValues(k.rule, k.desc, codeNames[code])
		c.hits[code] = m.detailedHitsVec.WithLabelValues(k.rule, k.desc, codeNames[code])
	}
	m.detailed.Store(k, c)
	return c, folded
}

// decisionDetailed counts one decision of a detailed_metric descriptor,
// desc being its detailed name (detailedName), in the rule's series and
// in the descriptor's.
func (m *Metrics) decisionDetailed(r *config.Rule, desc string, code int, hits float64) {
	m.decision(r, code, hits)
	c, folded := m.detailedCounters(r, desc)
	if folded {
		m.detailedFolded.Inc()
	}
	c.decisions[code].Inc()
	if hits > 0 {
		c.hits[code].Add(hits)
	}
}

// detailedName is a descriptor's name in its detailed series, as
// envoyproxy/ratelimit names its detailed stats: the domain, then each
// entry's key and value joined by '_', each after a '.'
// ("edge.remote_address_192.0.2.1.path_/api"), cut to maxDetailedLabel
// bytes.
func detailedName(domain string, entries []Entry) string {
	n := len(domain)
	for _, e := range entries {
		n += len(e.Key) + len(e.Value) + 2
	}
	b := make([]byte, 0, min(n, maxDetailedLabel+utf8.UTFMax))
	b = append(b, domain...)
	for _, e := range entries {
		if len(b) > maxDetailedLabel {
			break
		}
		b = append(append(append(append(b, '.'), e.Key...), '_'), e.Value...)
	}
	if len(b) > maxDetailedLabel {
		cut := maxDetailedLabel
		for cut > 0 && !utf8.RuneStart(b[cut]) { // at a character boundary
			cut--
		}
		b = b[:cut]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// methodCounters resolves a method's counters for every status code.
func (m *Metrics) methodCounters(full string) *callCounters {
	c := new(callCounters)
	name := methodLabel(full)
	for i := range numGRPCCodes {
		code := codes.Code(i).String()
		c.calls[i] = m.callVec.WithLabelValues(name, code)
		c.duration[i] = m.callDuration.WithLabelValues(name, code)
	}
	return c
}

// methodLabel is the method label of a full method name: its last
// element ("ShouldRateLimit", "Check").
func methodLabel(full string) string {
	if i := strings.LastIndexByte(full, '/'); i >= 0 {
		return full[i+1:]
	}
	return full
}

// Registry returns the registry holding the metrics (for /metrics).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// SetRules resolves the counters of cfg's rules. A rule named as one
// already known continues that rule's series. The previous
// configuration's rules that cfg still names stay resolved too, for the
// calls that started before it was replaced; the series of rules cfg no
// longer names are removed (a call in flight with such a rule is not
// counted).
//
// Why removed: every rule has 8 series, about 4 KB of heap, and they were
// kept for every name ever loaded, so a drop-in runtime file of 60,000
// descriptors took 240 MB of series, and a reload that renamed them as
// much again (issue 30: 370 MB, then 670 MB).
func (m *Metrics) SetRules(cfg *Config) {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := make(map[*config.Rule]*ruleCounters, 2*len(cfg.Rules()))
	names := make(map[string]bool, len(cfg.Rules()))
	for _, r := range cfg.Rules() {
		names[r.Name] = true
	}
	for _, r := range m.lastRules {
		if names[r.Name] {
			next[r] = m.byName[r.Name]
		}
	}
	for name := range m.byName {
		if !names[name] {
			for code := range numCodes {
				m.decisionVec.DeleteLabelValues(name, codeNames[code])
				m.hitsVec.DeleteLabelValues(name, codeNames[code])
			}
			m.quotaUsedVec.DeleteLabelValues(name)
			m.quotaCrossedVec.DeletePartialMatch(prometheus.Labels{"rule": name})
			delete(m.byName, name)
		}
	}
	for _, r := range cfg.Rules() {
		c := m.byName[r.Name]
		if c == nil {
			c = new(ruleCounters)
			for code := range numCodes {
				c.decisions[code] = m.decisionVec.WithLabelValues(r.Name, codeNames[code])
				c.hits[code] = m.hitsVec.WithLabelValues(r.Name, codeNames[code])
			}
			m.byName[r.Name] = c
		}
		if r.Quota != nil && c.quotaUsed == nil {
			c.quotaUsed = m.quotaUsedVec.WithLabelValues(r.Name)
		}
		next[r] = c
	}
	m.lastRules = cfg.Rules()
	m.rules.Store(&next)
}

// decision counts one descriptor's decision for rule r, weighted by hits.
func (m *Metrics) decision(r *config.Rule, code int, hits float64) {
	if c := (*m.rules.Load())[r]; c != nil {
		c.decisions[code].Inc()
		if hits > 0 {
			c.hits[code].Add(hits)
		}
	}
}

func (m *Metrics) request(code int) { m.requests[code].Inc() }

// quotaRatioBuckets are tokengate_rls_quota_used_ratio's upper bounds.
var quotaRatioBuckets = []float64{0.25, 0.5, 0.8, 0.9, 0.95, 0.99, 1}

// quotaCrossed counts threshold pct of quota rule r crossed first in a
// key's period: once per key, threshold and period, so the series is
// looked up by its labels here rather than resolved beforehand.
func (m *Metrics) quotaCrossed(r *config.Rule, pct string) {
	m.quotaCrossedVec.WithLabelValues(r.Name, pct).Inc()
}

// quotaUsed observes the share of its limit a key of quota rule r has used.
func (m *Metrics) quotaUsed(r *config.Rule, ratio float64) {
	if c := (*m.rules.Load())[r]; c != nil && c.quotaUsed != nil {
		c.quotaUsed.Observe(ratio)
	}
}

// Reloaded counts a reload of the configuration; err is its failure.
func (m *Metrics) Reloaded(err error) {
	if err != nil {
		m.reloads[1].Inc()
		return
	}
	m.reloads[0].Inc()
}

// SetRedisNode sets the node label of Redis errors that carry no address
// of their own: the address of a single Redis ("" for a Cluster, whose
// node a timeout does not say).
func (m *Metrics) SetRedisNode(addr string) { m.node.Store(&addr) }

// SetErrorLog makes ObserveRedis and the TLS handshake counter log what
// failed through l (rate-limited).
func (m *Metrics) SetErrorLog(l *ErrorLog) { m.errLog.Store(l) }

// WriteTo writes the metrics in the Prometheus text format.
func (m *Metrics) WriteTo(w io.Writer) (int64, error) {
	mfs, err := m.reg.Gather()
	if err != nil {
		return 0, err
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return 0, err
		}
	}
	return b.WriteTo(w)
}

// String returns WriteTo's text.
func (m *Metrics) String() string {
	var sb strings.Builder
	_, _ = m.WriteTo(&sb)
	return sb.String()
}
