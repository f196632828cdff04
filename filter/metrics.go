package filter

// Metric names. Each rule has ten counters named
// "tokengate.rule.<rule>.<counter>". Envoy keeps them in its "wasmcustom"
// stat namespace (wasmcustom.tokengate.rule.global-rps.allowed in /stats);
// /stats/prometheus strips that namespace and adds no envoy_ prefix, giving
// tokengate_rule_global_rps_allowed, or tokengate_rule_allowed{rule="global-rps"}
// with the stats_tags of envoy.yaml.
const (
	metricPrefix = "tokengate."
	// CounterAllowed counts requests the rule's bucket admitted (for a shadow
	// rule: would have admitted), each once: a rule awaiting its estimate
	// from the request body counts when the body has been read.
	CounterAllowed = "allowed"
	// CounterRejected counts requests rejected because this rule's bucket
	// lacked tokens, or because they lacked its limit key and the rule
	// says "on_missing_key": "deny".
	CounterRejected = "rejected"
	// CounterShadowRejected counts requests a shadow rule would have rejected.
	CounterShadowRejected = "shadow_rejected"
	// CounterFailOpen counts requests allowed without a decision because the
	// shared data failed or compare-and-swap attempts ran out.
	CounterFailOpen = "fail_open"
	// CounterCASRetries counts compare-and-swap mismatches while updating the
	// rule's buckets (a request with several rules counts them on each).
	CounterCASRetries = "cas_retries"
	// CounterDescriptorMissing counts requests the rule matched that lacked
	// a limit key: skipped, sent to the shared bucket or denied, as the
	// rule's on_missing_key says.
	CounterDescriptorMissing = "descriptor_missing"
	// CounterStoreDenied counts requests this rule rejected because their
	// buckets could not be updated (store failure or contention) and it
	// says "on_store_error": "deny". With several such rules only the first
	// applying one denies and counts.
	CounterStoreDenied = "store_denied"
	// CounterContention counts requests whose buckets could not be updated
	// because every compare-and-swap attempt (settings.cas_max_attempts)
	// lost its race: the shared data works but the keys are too hot. Such a
	// request also counts as fail_open, or as store_denied on the rule
	// that denied it.
	CounterContention = "contention"
	// CounterSlotTakeovers counts identities that took over a slot whose
	// bucket was idle (full) or corrupt (bounded key space).
	CounterSlotTakeovers = "slot_takeovers"
	// CounterSlotCollisions counts identities that found both their slots
	// holding live buckets of others and evicted the fuller one: the key
	// bound is too small for the number of clients active at once, or
	// someone is spraying keys.
	CounterSlotCollisions = "slot_collisions"
	// CounterSettleCharged, CounterSettleRefunded and CounterSettleReset
	// count requests settled after the response (docs/configuration.md,
	// "Settling after the response"): charged more than admission took,
	// refunded (a status count_statuses does not list, or a reported cost
	// below what admission took), or whose success filled the bucket
	// (reset_on_statuses).
	CounterSettleCharged  = "settle_charged"
	CounterSettleRefunded = "settle_refunded"
	CounterSettleReset    = "settle_reset"
	// CounterDelayed (defined for rules with max_reserved) counts requests the rule admitted into its
	// reservation (max_reserved) and held until their tokens were due.
	CounterDelayed = "delayed"
	// CounterDelayCancelled (defined for rules with max_reserved) counts held requests whose client left before
	// their release.
	CounterDelayCancelled = "delay_cancelled"
)

// Plugin-wide counters.
const (
	// MetricLocalState counts worker VMs that found the host has no shared
	// data (it answers UNIMPLEMENTED, as APISIX does) and keep their
	// buckets to themselves.
	MetricLocalState = "tokengate.local_state"
	// MetricSeedErrors counts configurations that could not read or create
	// the shared slot seed and used seed 0 instead.
	MetricSeedErrors = "tokengate.seed_errors"
	// MetricPanics counts panics recovered inside a callback (the request
	// was allowed).
	MetricPanics = "tokengate.panics"
	// MetricConfigRejected counts configurations refused by proxy_on_configure.
	MetricConfigRejected = "tokengate.config_rejected"
	// MetricCorruptState counts stored bucket values that could not be read
	// and were replaced by a full bucket.
	MetricCorruptState = "tokengate.corrupt_state"
	// MetricRLSErrors counts requests whose cluster rules the rate-limit
	// service did not decide (no callouts, dispatch failure, timeout, an
	// error or unusable answer); settings.rls.on_error applied.
	MetricRLSErrors = "tokengate.rls_errors"
	// MetricLeaseCalls counts lease requests and releases sent to the
	// rate-limit service by lease-mode rules (docs/lease.md).
	MetricLeaseCalls = "tokengate.lease_calls"
	// MetricRLSSettleCalls counts the calls that carried cluster-scope
	// settlements to the rate-limit service (one per stream that had any),
	// and MetricRLSSettleErrors those that failed or were never sent (no
	// callouts, too many in flight): their settlements are lost.
	MetricRLSSettleCalls  = "tokengate.rls_settle_calls"
	MetricRLSSettleErrors = "tokengate.rls_settle_errors"
)

// RuleMetricName returns the name of one of a rule's counters.
func RuleMetricName(rule, counter string) string {
	return metricPrefix + "rule." + rule + "." + counter
}

type ruleMetrics struct {
	_                                                                                                   incomparable
	allowed, rejected, shadowRejected, failOpen, casRetries, descriptorMissing, storeDenied, contention counter
	slotTakeovers, slotCollisions, delayed, delayCancelled                                              counter
	settleCharged, settleRefunded, settleReset                                                          counter
}

type pluginMetrics struct {
	_                                                                              incomparable
	panics, configRejected, corrupt, seedErrors, localState, rlsErrors, leaseCalls counter
	settleCalls, settleErrors                                                      counter
}

// counter is a defined metric; the zero value is a no-op.
type counter struct {
	_       incomparable
	id      uint32
	defined bool
}

// inc adds delta to c. Not inlined: it is called from some seventy
// places, and one copy of it keeps the module small.
//
//go:noinline
func (c counter) inc(h Host, delta int64) {
	if c.defined && delta != 0 {
		h.IncrementCounter(c.id, delta)
	}
}

func define(h Host, name string) counter {
	id, err := h.DefineCounter(name)
	if err != nil {
		h.Log(LogWarn, "tokengate: cannot define metric "+name+": "+err.Error())
		return counter{}
	}
	return counter{id: id, defined: true}
}

func (r *rule) defineMetrics(h Host) {
	n := func(c string) counter { return r.define(h, c) }
	r.metrics = ruleMetrics{
		allowed:           n(CounterAllowed),
		rejected:          n(CounterRejected),
		shadowRejected:    n(CounterShadowRejected),
		failOpen:          n(CounterFailOpen),
		casRetries:        n(CounterCASRetries),
		descriptorMissing: n(CounterDescriptorMissing),
		storeDenied:       n(CounterStoreDenied),
		contention:        n(CounterContention),
		slotTakeovers:     n(CounterSlotTakeovers),
		slotCollisions:    n(CounterSlotCollisions),
	}
	if r.Settle != nil {
		r.metrics.settleCharged = n(CounterSettleCharged)
		r.metrics.settleRefunded = n(CounterSettleRefunded)
		r.metrics.settleReset = n(CounterSettleReset)
	}
	if r.Delay.MaxReserved > 0 { // only rules that can delay have these
		r.metrics.delayed = n(CounterDelayed)
		r.metrics.delayCancelled = n(CounterDelayCancelled)
	}
}

// define defines r's counter c. Not inlined: defineMetrics calls it for
// every counter, and one copy of it keeps the module small.
//
//go:noinline
func (r *rule) define(h Host, c string) counter { return define(h, RuleMetricName(r.Name, c)) }
