package rlscontract

import (
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/internal/guest/lite"
)

// Keys of the descriptor entries tokengate sends, and the header that marks
// a settlement call (docs/rls.md, docs/lease.md).
const (
	// RuleKey and CompositeKey open every descriptor the filter sends for a
	// cluster-scope rule: the rule's name, then the bucket's composite key
	// (sharedstate.AppendComposite of the rule's limit key values).
	RuleKey      = "tokengate_rule"
	CompositeKey = "key"
	// LimitKey, third after RuleKey and CompositeKey, holds the limit a
	// verified identity carries for a quota rule (its limit_source), as a
	// decimal; tokengate-rls applies min(it, max_limit) and ignores a
	// value that is not a number > 0 (QuotaDescriptor).
	LimitKey = "tokengate_limit"
	// ModeKey, with the value ModeLease, marks a lease-mode descriptor.
	ModeKey = "tokengate_mode"
	// HolderKey, GrantKey, UnspentKey, WantKey and ReleaseKey are a lease
	// request's (Lease).
	HolderKey  = "tokengate_holder"
	GrantKey   = "tokengate_grant"
	UnspentKey = "tokengate_unspent"
	WantKey    = "tokengate_want"
	ReleaseKey = "tokengate_release"
	// SettleKey holds a settlement's kind (SettleRefund or SettleReset),
	// AmountKey a refund's tokens (Settlement).
	SettleKey = "tokengate_settle"
	AmountKey = "tokengate_amount"
	// SettleHeader, with the value "1", marks a settlement call: its plain
	// descriptors are extra hits to charge, not requests to decide. Either
	// protocol carries it as an HTTP header, which gRPC delivers to the
	// service as metadata.
	SettleHeader = "tokengate-settle"
	// ReceiptHeader carries a stream's receipt id (ValidReceipt) on its
	// admission and its settlement, when it has cluster rules that settle:
	// the service keeps what the admission took under it, and gives the
	// settlement back no more than that (docs/rls.md#receipts).
	ReceiptHeader = "tokengate-receipt"
)

// ValidReceipt reports whether id can be a receipt id: 8 to 64 ASCII
// letters and digits (the filter sends 16 hexadecimal digits, 63 random
// bits).
func ValidReceipt(id string) bool {
	for i := 0; i < len(id); i++ {
		c := id[i] | 0x20
		if !('0' <= id[i] && id[i] <= '9' || 'a' <= c && c <= 'z') {
			return false
		}
	}
	return len(id) >= 8 && len(id) <= 64
}

// ModeLease is ModeKey's value in a lease-mode descriptor.
const ModeLease = "lease"

// SettleKind is what a settlement does to a bucket. Refund and reset travel
// as SettleKey's value; tokengate-rls passes the kind to settle.lua.
type SettleKind string

// Settlement kinds.
const (
	// SettleCharge takes extra hits, whatever the bucket holds: the rule's
	// plain descriptor again, with no SettleKey entry.
	SettleCharge SettleKind = "charge"
	// SettleRefund gives tokens back.
	SettleRefund SettleKind = "refund"
	// SettleReset fills the bucket.
	SettleReset SettleKind = "reset"
)

// validUTF8 replaces invalid UTF-8 with U+FFFD: proto3 strings must be
// valid, and a composite key holds request bytes.
func validUTF8(s string) string { return lite.ToValidUTF8(s) }

// ClusterDescriptor returns the descriptor of a cluster-scope rule's
// request: [(RuleKey, rule), (CompositeKey, composite)], hits_addend hits
// (0: not sent, the request's applies).
func ClusterDescriptor(rule, composite string, hits uint64) Descriptor {
	return Descriptor{Entries: []Entry{{RuleKey, rule}, {CompositeKey, validUTF8(composite)}}, HitsAddend: hits}
}

// QuotaDescriptor returns the descriptor of a quota rule's request whose
// identity carries a limit: ClusterDescriptor's entries followed by
// (LimitKey, limit); without a limit ("") it is ClusterDescriptor's.
func QuotaDescriptor(rule, composite, limit string, hits uint64) Descriptor {
	d := ClusterDescriptor(rule, composite, hits)
	if limit != "" {
		d.Entries = append(d.Entries, Entry{LimitKey, validUTF8(limit)})
	}
	return d
}

// ParseCluster reports whether entries are exactly ClusterDescriptor's or
// QuotaDescriptor's and returns the rule and composite key they name, and
// the identity's limit ("" when absent; not checked: a number > 0 or
// nothing is the service's decision).
func ParseCluster(entries []Entry) (rule, composite, limit string, ok bool) {
	switch {
	case len(entries) < 2 || len(entries) > 3 || entries[0].Key != RuleKey || entries[1].Key != CompositeKey:
		return "", "", "", false
	case len(entries) == 3 && entries[2].Key != LimitKey:
		return "", "", "", false
	case len(entries) == 3:
		limit = entries[2].Value
	}
	return entries[0].Value, entries[1].Value, limit, true
}

// Lease is a lease-mode descriptor (docs/lease.md, "Wire protocol"): a
// holder's lease request or release or, without a holder, an exact take.
type Lease struct {
	Rule, Composite string
	// Holder is the proxy process's id; "" makes an exact take, which
	// sends Want as hits_addend and none of the fields below.
	Holder string
	// Grant is the id of the grant the holder holds (0: none), Unspent
	// the tokens it has left of it (>= 0, sent as the shortest decimal).
	Grant   uint64
	Unspent float64
	// Want is the new tokens asked for (0: a renewal of Unspent's expiry);
	// an exact take's cost.
	Want uint64
	// Release gives Unspent back instead.
	Release bool
}

// Exact reports whether l is an exact take: it has no holder.
func (l Lease) Exact() bool { return l.Holder == "" }

// LeaseDescriptor returns l's descriptor: [(RuleKey, rule), (CompositeKey,
// composite), (ModeKey, ModeLease)] and, for a holder, (HolderKey),
// (GrantKey), (UnspentKey), (WantKey) and, for a release, (ReleaseKey, "1").
func LeaseDescriptor(l Lease) Descriptor {
	n := 3
	if !l.Exact() {
		n = 8
	}
	e := append(make([]Entry, 0, n), Entry{RuleKey, l.Rule}, Entry{CompositeKey, validUTF8(l.Composite)}, Entry{ModeKey, ModeLease})
	if l.Exact() {
		return Descriptor{Entries: e, HitsAddend: l.Want}
	}
	e = append(e,
		Entry{HolderKey, l.Holder},
		Entry{GrantKey, strconv.FormatUint(l.Grant, 10)},
		Entry{UnspentKey, strconv.FormatFloat(l.Unspent, 'f', -1, 64)},
		Entry{WantKey, strconv.FormatUint(l.Want, 10)},
	)
	if l.Release {
		e = append(e, Entry{ReleaseKey, "1"})
	}
	return Descriptor{Entries: e}
}

// ErrMalformedLease is the error of a lease-mode descriptor ParseLease
// refuses; the error it returns names the entry.
var ErrMalformedLease = errors.New("malformed lease descriptor")

// maxHolderLen bounds a holder id, which becomes a Redis hash field.
const maxHolderLen = 64

// ParseLease reports whether d is a lease-mode descriptor (ModeKey=ModeLease
// after the rule and composite key) and reads it. An exact take (no
// holder) has its hits_addend as Want. Unknown entries, numbers that do not
// parse, a negative or infinite unspent, and a holder longer than 64 bytes
// or holding '{' or '}' are refused with ErrMalformedLease.
func ParseLease(d Descriptor) (l Lease, ok bool, err error) {
	es := d.Entries
	if len(es) < 3 || es[0].Key != RuleKey || es[1].Key != CompositeKey || es[2].Key != ModeKey || es[2].Value != ModeLease {
		return l, false, nil
	}
	l.Rule, l.Composite = es[0].Value, es[1].Value
	for _, e := range es[3:] {
		switch e.Key {
		case HolderKey:
			l.Holder = e.Value
		case GrantKey:
			l.Grant, err = strconv.ParseUint(e.Value, 10, 64)
		case UnspentKey:
			l.Unspent, err = strconv.ParseFloat(e.Value, 64)
			if err == nil && (l.Unspent < 0 || math.IsInf(l.Unspent, 0) || math.IsNaN(l.Unspent)) {
				err = ErrMalformedLease
			}
		case WantKey:
			l.Want, err = strconv.ParseUint(e.Value, 10, 64)
		case ReleaseKey:
			l.Release = e.Value == "1"
		default:
			err = ErrMalformedLease
		}
		if err != nil {
			return l, true, malformed{ErrMalformedLease, "entry " + strconv.Quote(e.Key) + ": " + strconv.Quote(e.Value)}
		}
	}
	if len(l.Holder) > maxHolderLen || strings.ContainsAny(l.Holder, "{}") {
		return l, true, malformed{ErrMalformedLease, "holder " + strconv.Quote(l.Holder)}
	}
	if l.Exact() {
		l.Want = d.HitsAddend
	}
	return l, true, nil
}

// malformed is an error wrapping err with what was wrong.
type malformed struct {
	err    error
	detail string
}

func (m malformed) Error() string { return m.err.Error() + ": " + m.detail }
func (m malformed) Unwrap() error { return m.err }

// Settlement is one settlement of a cluster-scope rule's bucket after the
// response (docs/rls.md, "Settling after the response").
type Settlement struct {
	Rule, Composite string
	Kind            SettleKind
	// Hits is a charge's extra tokens, sent as hits_addend; ParseSettlement
	// leaves it 0 when hits_addend is not set (the call's applies).
	Hits uint64
	// Amount is a refund's tokens (> 0, sent as the shortest decimal).
	Amount float64
}

// SettlementDescriptor returns s's descriptor: [(RuleKey, rule),
// (CompositeKey, composite)] with hits_addend Hits for a charge;
// followed by (SettleKey, "refund"), (AmountKey, Amount) for a refund, and
// by (SettleKey, "reset") for a reset.
func SettlementDescriptor(s Settlement) Descriptor {
	n := 2
	switch s.Kind {
	case SettleRefund:
		n = 4
	case SettleReset:
		n = 3
	}
	d := Descriptor{Entries: append(make([]Entry, 0, n), Entry{RuleKey, s.Rule}, Entry{CompositeKey, validUTF8(s.Composite)})}
	switch s.Kind {
	case SettleCharge:
		d.HitsAddend = s.Hits
	case SettleRefund:
		d.Entries = append(d.Entries, Entry{SettleKey, string(SettleRefund)},
			Entry{AmountKey, strconv.FormatFloat(s.Amount, 'f', -1, 64)})
	case SettleReset:
		d.Entries = append(d.Entries, Entry{SettleKey, string(SettleReset)})
	}
	return d
}

// ParseSettlement reads a settlement descriptor (SettlementDescriptor's
// forms). It refuses a descriptor that does not start with the rule and
// composite key, a refund whose amount is not a finite number > 0, and any
// other entries.
func ParseSettlement(d Descriptor) (Settlement, error) {
	es := d.Entries
	var s Settlement
	if len(es) < 2 || es[0].Key != RuleKey || es[1].Key != CompositeKey {
		return s, errors.New("a settlement descriptor starts with " + RuleKey + " and " + CompositeKey)
	}
	s.Rule, s.Composite = es[0].Value, es[1].Value
	rest := es[2:]
	switch {
	case len(rest) == 0:
		s.Kind, s.Hits = SettleCharge, d.HitsAddend
	case len(rest) == 1 && rest[0].Key == SettleKey && rest[0].Value == string(SettleReset):
		s.Kind = SettleReset
	case len(rest) == 2 && rest[0].Key == SettleKey && rest[0].Value == string(SettleRefund) && rest[1].Key == AmountKey:
		n, err := strconv.ParseFloat(rest[1].Value, 64)
		if err != nil || !(n > 0) || math.IsInf(n, 0) {
			return s, errors.New("refund amount " + strconv.Quote(rest[1].Value) + ": must be a number > 0")
		}
		s.Kind, s.Amount = SettleRefund, n
	default:
		return s, errors.New("settlement descriptor of rule " + strconv.Quote(s.Rule) + ": unknown entries")
	}
	return s, nil
}
