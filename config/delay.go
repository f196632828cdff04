package config

import (
	"strconv"

	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// Delay is a token-bucket rule's delayed admission (docs/configuration.md,
// "Delayed admission").
type Delay struct {
	_ incomparable
	// MaxReserved is the debt, in tokens, an admission may leave in the
	// bucket ("max_reserved"); 0 rejects as soon as the bucket is short.
	MaxReserved float64
	// MaxDelayMs caps the wait ("max_delay_ms"); 0 means no cap beyond
	// MaxReserved/rate.
	MaxDelayMs float64
	// MaxPending caps the requests this rule holds at once on one worker
	// ("max_pending", default DefaultMaxPending).
	MaxPending int
	// RefundOnCancel gives a held request's tokens back when its client
	// leaves before it is released ("refund_on_cancel").
	RefundOnCancel bool

	// Debt is the effective reservation, in tokens: MaxReserved, capped by
	// MaxDelayMs × rate (250 ms at 10/s caps a max_reserved of 5 at 2.5);
	// 0 for a rule that does not reserve. Parse puts it in the rule's
	// Limit as Reserve and MaxDebt, the bucket's own debt, so the stored
	// balance of a reserving rule is the true one, negative while in debt
	// (docs/configuration.md, "Delayed admission").
	Debt float64
}

// DefaultMaxPending is the default of max_pending.
const DefaultMaxPending = 1024

// delayFields are the algorithm_config fields of delayed admission.
var delayFields = []string{"max_reserved", "max_delay_ms", "max_pending", "refund_on_cancel"}

// maxDelayMs bounds max_delay_ms (one day): a request is never held longer.
const maxDelayMs = 86400e3

// delayConfig reads a token bucket's delayed admission; r.Limit is set.
func delayConfig(path string, v ljson.Result, r *Rule) error {
	d := Delay{MaxPending: DefaultMaxPending}
	mr := v.Get("max_reserved")
	if mr.Exists() {
		if mr.Type != ljson.Number {
			return errAt(path+".max_reserved", "must be a number, got "+typeName(mr))
		}
		f, err := strconv.ParseFloat(mr.Raw, 64)
		if err != nil || !(f >= 0 && f <= maxBurst) {
			return errAt(path+".max_reserved", "must be a number from 0 to "+num(maxBurst)+", got "+short(mr.Raw))
		}
		d.MaxReserved = f
	}
	for _, f := range delayFields[1:] {
		if v.Get(f).Exists() && !(d.MaxReserved > 0) {
			return errAt(path+"."+f, "needs max_reserved > 0 (without a reservation nothing is delayed)")
		}
	}
	if md := v.Get("max_delay_ms"); md.Exists() {
		f, err := positive(path+".max_delay_ms", md, maxDelayMs)
		if err != nil {
			return err
		}
		d.MaxDelayMs = f
	}
	if mp := v.Get("max_pending"); mp.Exists() {
		n, ok := integer(mp)
		if !ok || n < 1 || n > 1<<20 {
			return errAt(path+".max_pending", "must be an integer from 1 to "+strconv.Itoa(1<<20)+", got "+short(mp.Raw))
		}
		d.MaxPending = int(n)
	}
	if rc := v.Get("refund_on_cancel"); rc.Exists() {
		if rc.Type != ljson.True && rc.Type != ljson.False {
			return errAt(path+".refund_on_cancel", "must be true or false, got "+typeName(rc))
		}
		d.RefundOnCancel = rc.Type == ljson.True
	}
	d.Debt = d.MaxReserved
	if d.MaxDelayMs > 0 {
		d.Debt = min(d.Debt, d.MaxDelayMs/1000*r.Limit.Rate)
	}
	if d.MaxReserved > 0 && r.Limit.Burst+d.Debt > maxBurst {
		return errAt(path+".max_reserved", "burst + max_reserved must be <= "+num(maxBurst)+", got "+num(r.Limit.Burst+d.MaxReserved))
	}
	r.Delay = d
	if d.Debt > 0 {
		// The bucket's own debt: Take may leave the balance down to
		// -Debt, which is also its floor (no settlement can share it:
		// settleConfig refuses the combination).
		r.Limit.Reserve, r.Limit.MaxDebt = d.Debt, d.Debt
	}
	return nil
}
