package filter

import (
	"reflect"
	"testing"

	"github.com/tokengate/tokengate/sharedstate"
)

// leaseTestParams: a refill period of 1/8 s and a timeout of 1/16 s, so
// that the instants below and the records' sums are exact in binary.
var leaseTestParams = leaseParams{tick: 0.125, timeout: 0.0625, max: 8, ttl: 2}

func (a leaseAction) String() string {
	return [...]string{"keep", "renew", "exact", "release", "roll", "forget"}[a]
}

// TestLeaseDecide walks one bucket's record through its life at fixed
// instants: before each step, event changes the record as the requests and
// the answers between two ticks do (leaseTake, leaseApply); then the tick
// decides, and the step checks the action, the tokens asked for and the
// record written, which the next step starts from.
func TestLeaseDecide(t *testing.T) {
	const t0 = 1000.0
	type rec = sharedstate.LeaseRecord
	steps := []struct {
		now    float64
		urgent bool
		event  func(r *rec)
		act    leaseAction
		want   float64
		next   rec
	}{
		// 0. A cold request waits. The periodic tick: no lease to renew.
		{now: t0, event: func(r *rec) { r.Used, r.Since, r.Wait = 1, t0, 1 },
			act: leaseKeep, next: rec{Used: 1, Since: t0, Wait: 1}},
		// 1. The urgent tick: cold, an exact take of the waiting cost; the
		// claim names the call and a new demand window starts.
		{now: t0 + 1.0/64, urgent: true,
			act: leaseExact, want: 1, next: rec{Since: t0 + 1.0/64, Claim: t0 + 1.0/64 + 0.0625 + 1, Claimer: 1, Hold: t0 + 1.0/64 + 0.125}},
		// 2. Another request waits meanwhile: nothing while the call is out.
		{now: t0 + 2.0/64, urgent: true, event: func(r *rec) { r.Used, r.Since, r.Wait = 1, t0+2.0/64, 1 },
			act: leaseKeep, next: rec{Used: 1, Since: t0 + 2.0/64, Wait: 1, Claim: t0 + 1.0/64 + 1.0625, Claimer: 1, Hold: t0 + 1.0/64 + 0.125}},
		// 3. The take is granted in full (Ramp 1, round trip 1/64 s) and
		// spent by its request. The one still waiting: a ramp goes out at
		// once, a lease request sized from the demand, 1 in 1/64 s over a
		// period: ceil(2 × 8/s × (1/8 + 1/32)) = 3, at least 2 × Ramp.
		{now: t0 + 3.0/64, urgent: true, event: func(r *rec) { r.Claim, r.Ramp, r.RTT, r.TakenSeq = 0, 1, 1.0/64, 1 },
			act: leaseRenew, want: 3, next: rec{Since: t0 + 3.0/64, Claim: t0 + 3.0/64 + 1.0625, Claimer: 2, Hold: t0 + 3.0/64 + 0.125, Ramp: 1, RTT: 1.0 / 64, TakenSeq: 1}},
		// 4. Granted 3 (grant 7, expiring a ttl after the send, Ramp 3); the
		// waiting request spends one. The periodic tick within the period:
		// nothing.
		{now: t0 + 4.0/64, event: func(r *rec) {
			r.Claim, r.Tokens, r.Grant, r.Expiry, r.Ramp = 0, 2, 7, t0+3.0/64+2, 3
			r.Used, r.Since = 1, t0+4.0/64
		},
			act: leaseKeep, next: rec{Tokens: 2, Expiry: t0 + 3.0/64 + 2, Grant: 7, Used: 1, Since: t0 + 4.0/64, Claimer: 2, Hold: t0 + 11.0/64, Ramp: 3, RTT: 1.0 / 64, TakenSeq: 1}},
		// 5. The period's end: 1 used, 2 held for a target of 3: renew for
		// 1 more, reporting the 2.
		{now: t0 + 11.0/64,
			act: leaseRenew, want: 1, next: rec{Tokens: 2, Expiry: t0 + 3.0/64 + 2, Grant: 7, Since: t0 + 11.0/64, Claim: t0 + 11.0/64 + 1.0625, Claimer: 3, Hold: t0 + 19.0/64, Ramp: 3, RTT: 1.0 / 64, TakenSeq: 1}},
		// 6. Granted 8 in all (grant 8); 1 request in the period. The next
		// period's tick: 8 cover the demand: the window rolls, no call.
		{now: t0 + 19.0/64, event: func(r *rec) {
			r.Claim, r.Tokens, r.Grant, r.Expiry = 0, 8, 8, t0+11.0/64+2
			r.Used = 1
		},
			act: leaseRoll, next: rec{Tokens: 8, Expiry: t0 + 11.0/64 + 2, Grant: 8, Since: t0 + 19.0/64, Claimer: 3, Hold: t0 + 19.0/64, Ramp: 3, RTT: 1.0 / 64, TakenSeq: 1}},
		// 7. Idle for less than half a ttl: nothing.
		{now: t0 + 19.0/64 + 0.875,
			act: leaseKeep, next: rec{Tokens: 8, Expiry: t0 + 11.0/64 + 2, Grant: 8, Since: t0 + 19.0/64, Claimer: 3, Hold: t0 + 19.0/64, Ramp: 3, RTT: 1.0 / 64, TakenSeq: 1}},
		// 8. Idle for half a ttl: release the 8; nothing is spendable
		// while they are being returned.
		{now: t0 + 19.0/64 + 1,
			act: leaseRelease, next: rec{Grant: 8, Since: t0 + 19.0/64 + 1, Claim: t0 + 19.0/64 + 1 + 1.0625, Claimer: 4, Hold: t0 + 19.0/64 + 1.125, Ramp: 3, RTT: 1.0 / 64, TakenSeq: 1}},
		// 9. The release answered (Hold and Ramp cleared): no lease, idle
		// for less than twice the ttl: kept.
		{now: t0 + 19.0/64 + 4.875, event: func(r *rec) { r.Claim, r.Hold, r.Ramp = 0, 0, 0 },
			act: leaseKeep, next: rec{Grant: 8, Since: t0 + 19.0/64 + 1, Claimer: 4, RTT: 1.0 / 64, TakenSeq: 1}},
		// 10. Idle for twice the ttl: forgotten.
		{now: t0 + 19.0/64 + 5,
			act: leaseForget, next: rec{Grant: 8, Since: t0 + 19.0/64 + 1, Claimer: 4, RTT: 1.0 / 64, TakenSeq: 1}},
	}
	var r rec
	for i, s := range steps {
		if s.event != nil {
			s.event(&r)
		}
		act, want, next := leaseDecide(r, leaseTestParams, s.now, s.urgent)
		if act != s.act || want != s.want || !reflect.DeepEqual(next, s.next) {
			t.Fatalf("step %d: got %v want %v, record %+v;\nwant %v want %v, record %+v", i, act, want, next, s.act, s.want, s.next)
		}
		r = next
	}
}

// TestLeaseDecideCases: one decision each, from a given record.
func TestLeaseDecideCases(t *testing.T) {
	const now = 1000.0
	type rec = sharedstate.LeaseRecord
	// live: grant 7 holding 8 for another second, 1 used in the last
	// period; claimed a period ago.
	live := rec{Tokens: 8, Expiry: now + 1, Grant: 7, Used: 1, Since: now - 0.125, Claimer: 3, Hold: now, RTT: 1.0 / 64}
	with := func(r rec, f func(*rec)) rec { f(&r); return r }
	claimed := func(r rec, f func(*rec)) rec {
		r.Claimer++
		r.Claim, r.Hold = now+1.0625, now+0.125
		r.Used, r.Since, r.Wait = 0, now, 0
		r.Tokens = r.Spendable(now)
		if f != nil {
			f(&r)
		}
		return r
	}
	shadow := leaseTestParams
	shadow.shadow = true
	tests := []struct {
		name     string
		rec      rec
		params   leaseParams
		urgent   bool
		act      leaseAction
		want     float64
		expected rec
	}{
		{name: "a call in flight", rec: with(live, func(r *rec) { r.Claim = now + 1 }), urgent: true,
			act: leaseKeep, expected: with(live, func(r *rec) { r.Claim = now + 1 })},
		{name: "known empty", rec: with(live, func(r *rec) { r.Retry = now + 0.5 }), urgent: true,
			act: leaseKeep, expected: with(live, func(r *rec) { r.Retry = now + 0.5 })},
		{name: "urgent within the period of a call not granted in full",
			rec: with(live, func(r *rec) { r.Hold, r.Wait = now+0.0625, 1 }), urgent: true,
			act: leaseKeep, expected: with(live, func(r *rec) { r.Hold, r.Wait = now+0.0625, 1 })},
		{name: "urgent within the period of a call granted in full: at once",
			rec: with(live, func(r *rec) { r.Tokens, r.Hold, r.Ramp, r.Wait = 0, now+0.0625, 3, 1 }), urgent: true,
			act: leaseRenew, want: 6, expected: claimed(with(live, func(r *rec) { r.Tokens, r.Ramp = 0, 3 }), nil)},
		{name: "periodic a little early (within a tenth of the period)",
			rec: with(live, func(r *rec) { r.Hold = now + 0.01; r.Tokens = 0 }),
			act: leaseRenew, want: 3, expected: claimed(with(live, func(r *rec) { r.Hold, r.Tokens = now+0.01, 0 }), nil)},
		{name: "periodic too early",
			rec: with(live, func(r *rec) { r.Hold = now + 0.0625; r.Tokens = 0 }),
			act: leaseKeep, expected: with(live, func(r *rec) { r.Hold = now + 0.0625; r.Tokens = 0 })},
		{name: "warm, waiting for more than lease_max: an exact take",
			rec: with(live, func(r *rec) { r.Wait = 9.5 }), urgent: true,
			act: leaseExact, want: 10, expected: claimed(live, nil)},
		{name: "warm by a full take, more than lease_max waiting, the last take still some waiting requests'",
			rec: rec{Used: 9, Since: now - 0.0625, Wait: 9, Claimer: 2, Hold: now + 0.0625, Ramp: 1, Taken: 1, TakenSeq: 2}, urgent: true,
			act: leaseKeep, expected: rec{Used: 9, Since: now - 0.0625, Wait: 9, Claimer: 2, Hold: now + 0.0625, Ramp: 1, Taken: 1, TakenSeq: 2}},
		{name: "cold, the last take's period over: another take",
			rec: rec{Used: 1, Since: now - 0.0625, Wait: 1, Claimer: 2, Hold: now, Taken: 1, TakenSeq: 2}, urgent: true,
			act: leaseExact, want: 1, expected: claimed(rec{Claimer: 2, Taken: 1, TakenSeq: 2}, nil)},
		// Issue 22 (lease mode starved proxies): a cold process whose take
		// was refused (Retry set after its claim at Hold - tick), with
		// requests turned away about once a period since, asks as a
		// holder: the service keeps the free tokens in the holders'
		// shares, and a take would never get any.
		{name: "cold but contended: a lease request, even for more than lease_max",
			rec: rec{Used: 14, Since: now - 0.25, Wait: 12, Claimer: 2, Hold: now - 0.25, Retry: now - 0.01}, urgent: true,
			act: leaseRenew, want: 8, expected: claimed(rec{Claimer: 2, Retry: now - 0.01}, nil)},
		{name: "cold, a refused take long ago and one request turned away since: a take",
			rec: rec{Used: 2, Since: now - 3, Wait: 1, Claimer: 2, Hold: now - 3.125, Retry: now - 0.01}, urgent: true,
			act: leaseExact, want: 1, expected: claimed(rec{Claimer: 2, Retry: now - 0.01}, nil)},
		{name: "cold, a refused take, only the waiting request since: a take",
			rec: rec{Used: 1, Since: now, Wait: 1, Claimer: 2, Hold: now - 2.5, Retry: now}, urgent: true,
			act: leaseExact, want: 1, expected: claimed(rec{Claimer: 2, Retry: now}, nil)},
		{name: "urgent, warm: at least one token",
			rec: with(live, func(r *rec) { r.Used, r.Wait = 0, 1 }), urgent: true,
			act: leaseRenew, want: 1, expected: claimed(live, nil)},
		{name: "periodic, enough held but expiring within a period and a round trip: renew for 0",
			rec: with(live, func(r *rec) { r.Expiry = now + 0.125 }),
			act: leaseRenew, want: 0, expected: claimed(with(live, func(r *rec) { r.Expiry = now + 0.125 }), nil)},
		{name: "periodic, expired grant: the process holds no lease",
			rec: with(live, func(r *rec) { r.Expiry = now }),
			act: leaseKeep, expected: with(live, func(r *rec) { r.Expiry = now })},
		{name: "periodic, a shadow rule's demand with no lease: renew",
			rec: rec{Used: 2, Since: now - 0.125, Claimer: 1}, params: shadow,
			act: leaseRenew, want: 6, expected: claimed(rec{Claimer: 1}, nil)},
		{name: "periodic, no demand, nothing held, idle for less than twice the ttl",
			rec: with(live, func(r *rec) { r.Used, r.Tokens, r.Since = 0, 0, now-3.875 }),
			act: leaseKeep, expected: with(live, func(r *rec) { r.Used, r.Tokens, r.Since = 0, 0, now-3.875 })},
		{name: "periodic, no demand, nothing held, idle twice the ttl: forget",
			rec: with(live, func(r *rec) { r.Used, r.Tokens, r.Since = 0, 0, now-4 }),
			act: leaseForget, expected: with(live, func(r *rec) { r.Used, r.Tokens, r.Since = 0, 0, now-4 })},
		{name: "periodic, demand within the period: no roll yet",
			rec: with(live, func(r *rec) { r.Since = now - 0.0625 }),
			act: leaseKeep, expected: with(live, func(r *rec) { r.Since = now - 0.0625 })},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pp := tc.params
			if pp == (leaseParams{}) {
				pp = leaseTestParams
			}
			act, want, next := leaseDecide(tc.rec, pp, now, tc.urgent)
			if act != tc.act || want != tc.want || !reflect.DeepEqual(next, tc.expected) {
				t.Fatalf("got %v want %v, record %+v;\nwant %v want %v, record %+v", act, want, next, tc.act, tc.want, tc.expected)
			}
		})
	}
}
