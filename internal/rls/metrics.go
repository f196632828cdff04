package rls

import (
	"bufio"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

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
	numReqs
)

var reqNames = [numReqs]string{"ok", "over_limit", "unavailable", "invalid_argument"}

// latencyBuckets are the upper bounds, in seconds, of the Redis round-trip
// histogram.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

// Metrics are the service's counters, written as Prometheus text by
// WriteTo. The rule set is fixed when they are made, so counting takes no
// lock.
type Metrics struct {
	rules     map[*config.Rule]*[numCodes]atomic.Uint64
	order     []*config.Rule
	requests  [numReqs]atomic.Uint64
	unmatched atomic.Uint64

	refundErrors atomic.Uint64
	redisErrors  atomic.Uint64
	redisCalls   atomic.Uint64
	redisSumNs   atomic.Uint64
	redisHist    []atomic.Uint64 // per latencyBuckets, not cumulative
}

// NewMetrics returns zeroed counters for cfg's rules.
func NewMetrics(cfg *Config) *Metrics {
	m := &Metrics{rules: map[*config.Rule]*[numCodes]atomic.Uint64{}, redisHist: make([]atomic.Uint64, len(latencyBuckets)+1)}
	for _, r := range cfg.Rules() {
		m.rules[r] = new([numCodes]atomic.Uint64)
		m.order = append(m.order, r)
	}
	return m
}

func (m *Metrics) decision(r *config.Rule, code int) {
	if c := m.rules[r]; c != nil {
		c[code].Add(1)
	}
}

func (m *Metrics) request(code int) { m.requests[code].Add(1) }

// ObserveRedis records one pipelined round trip to Redis; the Store calls
// it (StoreOptions.Observe).
func (m *Metrics) ObserveRedis(d time.Duration, err error) {
	m.redisCalls.Add(1)
	m.redisSumNs.Add(uint64(d))
	if err != nil {
		m.redisErrors.Add(1)
	}
	s := d.Seconds()
	i := 0
	for i < len(latencyBuckets) && s > latencyBuckets[i] {
		i++
	}
	m.redisHist[i].Add(1)
}

// WriteTo writes the metrics in the Prometheus text format.
func (m *Metrics) WriteTo(w io.Writer) (int64, error) {
	b := bufio.NewWriter(w)
	p := func(s ...string) {
		for _, x := range s {
			b.WriteString(x)
		}
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	p("# HELP tokengate_rls_decisions_total Descriptor decisions by rule and code.\n",
		"# TYPE tokengate_rls_decisions_total counter\n")
	for _, r := range m.order {
		c := m.rules[r]
		for code := range numCodes {
			p(`tokengate_rls_decisions_total{rule="`, r.Name, `",code="`, codeNames[code], `"} `, u(c[code].Load()), "\n")
		}
	}
	p("# HELP tokengate_rls_requests_total ShouldRateLimit calls by outcome.\n",
		"# TYPE tokengate_rls_requests_total counter\n")
	for code := range numReqs {
		p(`tokengate_rls_requests_total{code="`, reqNames[code], `"} `, u(m.requests[code].Load()), "\n")
	}
	p("# HELP tokengate_rls_unmatched_descriptors_total Descriptors no rule applies to (answered OK).\n",
		"# TYPE tokengate_rls_unmatched_descriptors_total counter\n",
		"tokengate_rls_unmatched_descriptors_total ", u(m.unmatched.Load()), "\n")
	p("# HELP tokengate_rls_redis_errors_total Pipelined Redis round trips with at least one failed command.\n",
		"# TYPE tokengate_rls_redis_errors_total counter\n",
		"tokengate_rls_redis_errors_total ", u(m.redisErrors.Load()), "\n")
	p("# HELP tokengate_rls_refund_errors_total Refunds that failed: tokens stay taken for a rejected request.\n",
		"# TYPE tokengate_rls_refund_errors_total counter\n",
		"tokengate_rls_refund_errors_total ", u(m.refundErrors.Load()), "\n")
	p("# HELP tokengate_rls_redis_duration_seconds Pipelined Redis round trips (one per request, plus one per refund).\n",
		"# TYPE tokengate_rls_redis_duration_seconds histogram\n")
	var cum uint64
	for i, le := range latencyBuckets {
		cum += m.redisHist[i].Load()
		p(`tokengate_rls_redis_duration_seconds_bucket{le="`, strconv.FormatFloat(le, 'g', -1, 64), `"} `, u(cum), "\n")
	}
	cum += m.redisHist[len(latencyBuckets)].Load()
	p(`tokengate_rls_redis_duration_seconds_bucket{le="+Inf"} `, u(cum), "\n",
		"tokengate_rls_redis_duration_seconds_sum ", strconv.FormatFloat(float64(m.redisSumNs.Load())/1e9, 'g', -1, 64), "\n",
		"tokengate_rls_redis_duration_seconds_count ", u(m.redisCalls.Load()), "\n")
	n := int64(b.Buffered())
	return n, b.Flush()
}

// String returns WriteTo's text.
func (m *Metrics) String() string {
	var sb strings.Builder
	_, _ = m.WriteTo(&sb)
	return sb.String()
}
