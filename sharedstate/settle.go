package sharedstate

import (
	"errors"

	"github.com/tokengate/tokengate/bucket"
)

// SettleOp is what Updater.Settle does to a bucket after the request that
// took from it has ended.
type SettleOp int

const (
	// SettleRefund gives tokens back (bucket.Limit.Refund): the request
	// cost less than it was charged, or its status is not counted.
	SettleRefund SettleOp = iota
	// SettleCharge takes more tokens whatever the bucket holds, down to
	// -MaxDebt (bucket.Limit.Charge): the request cost more than it was
	// charged.
	SettleCharge
	// SettleReset fills the bucket (bucket.Limit.Reset): a success that
	// clears the key's failures.
	SettleReset
)

// Settle applies op with amount tokens to the bucket an earlier allowed
// TakeAll took r's cost from (r.Stored), with its own bounded get → compute
// → compare-and-swap loop, and returns the CAS mismatches seen. It is how a
// cost known only after the response (or a status that is not counted) is
// settled.
//
// A bucket that has vanished (evicted) or turned corrupt is left alone: both
// read as a full bucket. A slot keeps whatever owner it has by then: if the
// identity shared another's slot (a collision), that is the bucket it took
// from, and the one it settles with. An amount that is not > 0 changes
// nothing for a refund or a charge; nothing is written then.
func (u *Updater) Settle(r *Request, op SettleOp, amount, now float64) (int, error) {
	if r.Stored == "" {
		return 0, errors.New("sharedstate: Settle of a request TakeAll did not store")
	}
	if op != SettleReset && !(amount > 0) {
		return 0, nil
	}
	now = Quantize(now)
	if !(now > 0) {
		return 0, errBadNow
	}
	mismatches := 0
	for tries := 0; tries < u.maxAttempts(); tries++ {
		v, cas, err := u.Store.Get(r.Stored)
		if errors.Is(err, ErrNotFound) {
			return mismatches, nil
		}
		if err != nil {
			return mismatches, err
		}
		s, owner, hasOwner, perr := parseValue(v)
		if perr != nil || s.Last > now+u.maxFuture() {
			return mismatches, nil
		}
		var next bucket.State
		switch op {
		case SettleCharge:
			next = r.Limit.Charge(s, now, amount)
		case SettleReset:
			next = r.Limit.Reset(s, now)
		default:
			next = r.Limit.Refund(s, now, amount)
		}
		p := pending{owner: string(owner), hasOwner: hasOwner}
		u.buf = p.value(u.buf[:0], next)
		err = u.Store.Set(r.Stored, u.buf, cas)
		if err == nil {
			return mismatches, nil
		}
		if !errors.Is(err, ErrCASMismatch) {
			return mismatches, err
		}
		mismatches++
		if u.Backoff != nil {
			u.Backoff(tries + 1)
		}
	}
	return mismatches, ErrContention
}
