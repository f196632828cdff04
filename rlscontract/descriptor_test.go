package rlscontract_test

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/rlscontract"
)

type entries = []rlscontract.Entry

func TestClusterDescriptor(t *testing.T) {
	for _, tc := range []struct {
		name            string
		rule, composite string
		hits            uint64
		expected        rlscontract.Descriptor
		expectedComp    string
	}{
		{"plain", "api", "192.0.2.1", 1,
			rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "api"}, {Key: "key", Value: "192.0.2.1"}}, HitsAddend: 1}, "192.0.2.1"},
		{"no hits", "api", "", 0,
			rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "api"}, {Key: "key", Value: ""}}}, ""},
		{"invalid UTF-8 goes out as U+FFFD", "api", "a\xffb", 7,
			rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "api"}, {Key: "key", Value: "a\uFFFDb"}}, HitsAddend: 7}, "a\uFFFDb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := rlscontract.ClusterDescriptor(tc.rule, tc.composite, tc.hits)
			if !reflect.DeepEqual(d, tc.expected) {
				t.Fatalf("ClusterDescriptor: got %+v, want %+v", d, tc.expected)
			}
			rule, comp, limit, ok := rlscontract.ParseCluster(d.Entries)
			if !ok || rule != tc.rule || comp != tc.expectedComp || limit != "" {
				t.Errorf("ParseCluster: got %q %q %q %v, want %q %q \"\" true", rule, comp, limit, ok, tc.rule, tc.expectedComp)
			}
		})
	}
	for _, es := range []entries{
		nil,
		{{Key: "tokengate_rule", Value: "api"}},
		{{Key: "key", Value: "k"}, {Key: "tokengate_rule", Value: "api"}},
		{{Key: "tokengate_rule", Value: "api"}, {Key: "key", Value: "k"}, {Key: "tokengate_mode", Value: "lease"}},
		{{Key: "remote_address", Value: "192.0.2.1"}, {Key: "key", Value: "k"}},
		{{Key: "tokengate_rule", Value: "api"}, {Key: "key", Value: "k"}, {Key: "tokengate_limit", Value: "5"}, {Key: "x", Value: "y"}},
		{{Key: "tokengate_rule", Value: "api"}, {Key: "tokengate_limit", Value: "5"}, {Key: "key", Value: "k"}},
	} {
		if rule, comp, limit, ok := rlscontract.ParseCluster(es); ok {
			t.Errorf("ParseCluster(%v) = %q %q %q, want not a cluster descriptor", es, rule, comp, limit)
		}
	}
}

// TestQuotaDescriptor: an identity's limit travels as a third entry that
// ParseCluster returns; without one the descriptor is ClusterDescriptor's.
func TestQuotaDescriptor(t *testing.T) {
	for _, tc := range []struct {
		name, limit   string
		expected      rlscontract.Descriptor
		expectedLimit string
	}{
		{"with a limit", "2500", rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "q"}, {Key: "key", Value: "k"},
			{Key: "tokengate_limit", Value: "2500"}}, HitsAddend: 3}, "2500"},
		{"not a number is sent as is", "lots", rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "q"}, {Key: "key", Value: "k"},
			{Key: "tokengate_limit", Value: "lots"}}, HitsAddend: 3}, "lots"},
		{"invalid UTF-8", "1\xff", rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "q"}, {Key: "key", Value: "k"},
			{Key: "tokengate_limit", Value: "1\uFFFD"}}, HitsAddend: 3}, "1\uFFFD"},
		{"without a limit", "", rlscontract.ClusterDescriptor("q", "k", 3), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := rlscontract.QuotaDescriptor("q", "k", tc.limit, 3)
			if !reflect.DeepEqual(d, tc.expected) {
				t.Fatalf("QuotaDescriptor: got %+v, want %+v", d, tc.expected)
			}
			rule, comp, limit, ok := rlscontract.ParseCluster(d.Entries)
			if !ok || rule != "q" || comp != "k" || limit != tc.expectedLimit {
				t.Errorf("ParseCluster: got %q %q %q %v, want \"q\" \"k\" %q true", rule, comp, limit, ok, tc.expectedLimit)
			}
		})
	}
}

func TestLeaseDescriptorRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lease    rlscontract.Lease
		expected rlscontract.Descriptor
	}{
		{"exact take", rlscontract.Lease{Rule: "l", Composite: "k", Want: 3},
			rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "l"}, {Key: "key", Value: "k"}, {Key: "tokengate_mode", Value: "lease"}}, HitsAddend: 3}},
		{"first lease", rlscontract.Lease{Rule: "l", Composite: "k", Holder: "1000000000000abc", Want: 40},
			rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "l"}, {Key: "key", Value: "k"}, {Key: "tokengate_mode", Value: "lease"},
				{Key: "tokengate_holder", Value: "1000000000000abc"}, {Key: "tokengate_grant", Value: "0"}, {Key: "tokengate_unspent", Value: "0"}, {Key: "tokengate_want", Value: "40"}}}},
		{"renewal", rlscontract.Lease{Rule: "l", Composite: "k", Holder: "h", Grant: 18446744073709551615, Unspent: 12.345678},
			rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "l"}, {Key: "key", Value: "k"}, {Key: "tokengate_mode", Value: "lease"},
				{Key: "tokengate_holder", Value: "h"}, {Key: "tokengate_grant", Value: "18446744073709551615"}, {Key: "tokengate_unspent", Value: "12.345678"}, {Key: "tokengate_want", Value: "0"}}}},
		{"release", rlscontract.Lease{Rule: "l", Composite: "k", Holder: "h", Grant: 7, Unspent: 0.5, Release: true},
			rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "l"}, {Key: "key", Value: "k"}, {Key: "tokengate_mode", Value: "lease"},
				{Key: "tokengate_holder", Value: "h"}, {Key: "tokengate_grant", Value: "7"}, {Key: "tokengate_unspent", Value: "0.5"}, {Key: "tokengate_want", Value: "0"},
				{Key: "tokengate_release", Value: "1"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := rlscontract.LeaseDescriptor(tc.lease)
			if !reflect.DeepEqual(d, tc.expected) {
				t.Fatalf("LeaseDescriptor:\ngot  %+v\nwant %+v", d, tc.expected)
			}
			l, ok, err := rlscontract.ParseLease(d)
			if !ok || err != nil || l != tc.lease {
				t.Errorf("ParseLease: got %+v %v %v, want %+v true <nil>", l, ok, err, tc.lease)
			}
		})
	}
}

func TestParseLeaseRefuses(t *testing.T) {
	head := entries{{Key: "tokengate_rule", Value: "l"}, {Key: "key", Value: "k"}, {Key: "tokengate_mode", Value: "lease"}}
	with := func(es ...rlscontract.Entry) rlscontract.Descriptor {
		return rlscontract.Descriptor{Entries: append(append(entries{}, head...), es...)}
	}
	for _, tc := range []struct {
		name        string
		input       rlscontract.Descriptor
		expectedErr string
	}{
		{"an unknown entry", with(rlscontract.Entry{Key: "tokengate_holder", Value: "h"}, rlscontract.Entry{Key: "colour", Value: "red"}),
			`malformed lease descriptor: entry "colour": "red"`},
		{"a grant that is not a number", with(rlscontract.Entry{Key: "tokengate_grant", Value: "x"}),
			`malformed lease descriptor: entry "tokengate_grant": "x"`},
		{"a negative grant", with(rlscontract.Entry{Key: "tokengate_grant", Value: "-1"}),
			`malformed lease descriptor: entry "tokengate_grant": "-1"`},
		{"a negative unspent", with(rlscontract.Entry{Key: "tokengate_unspent", Value: "-0.5"}),
			`malformed lease descriptor: entry "tokengate_unspent": "-0.5"`},
		{"an infinite unspent", with(rlscontract.Entry{Key: "tokengate_unspent", Value: "+Inf"}),
			`malformed lease descriptor: entry "tokengate_unspent": "+Inf"`},
		{"a NaN unspent", with(rlscontract.Entry{Key: "tokengate_unspent", Value: "NaN"}),
			`malformed lease descriptor: entry "tokengate_unspent": "NaN"`},
		{"a fractional want", with(rlscontract.Entry{Key: "tokengate_want", Value: "1.5"}),
			`malformed lease descriptor: entry "tokengate_want": "1.5"`},
		{"a holder too long", with(rlscontract.Entry{Key: "tokengate_holder", Value: strings.Repeat("h", 65)}),
			`malformed lease descriptor: holder "` + strings.Repeat("h", 65) + `"`},
		{"a holder with a brace", with(rlscontract.Entry{Key: "tokengate_holder", Value: "h}"}),
			`malformed lease descriptor: holder "h}"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ok, err := rlscontract.ParseLease(tc.input)
			if !ok || err == nil || err.Error() != tc.expectedErr {
				t.Fatalf("got %v %v, want true %q", ok, err, tc.expectedErr)
			}
			if !errors.Is(err, rlscontract.ErrMalformedLease) {
				t.Errorf("%v is not ErrMalformedLease", err)
			}
		})
	}
	// Not lease mode at all: no error, ok false (an ordinary descriptor).
	for _, es := range []entries{
		head[:2],
		{{Key: "tokengate_rule", Value: "l"}, {Key: "key", Value: "k"}, {Key: "tokengate_mode", Value: "exact"}},
		{{Key: "key", Value: "k"}, {Key: "tokengate_rule", Value: "l"}, {Key: "tokengate_mode", Value: "lease"}},
		{{Key: "tokengate_mode", Value: "lease"}, {Key: "tokengate_rule", Value: "l"}, {Key: "key", Value: "k"}},
	} {
		if l, ok, err := rlscontract.ParseLease(rlscontract.Descriptor{Entries: es}); ok || err != nil {
			t.Errorf("ParseLease(%v) = %+v %v %v, want not a lease descriptor", es, l, ok, err)
		}
	}
}

func TestSettlementDescriptorRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name     string
		set      rlscontract.Settlement
		expected rlscontract.Descriptor
	}{
		{"charge", rlscontract.Settlement{Rule: "llm", Composite: "192.0.2.1", Kind: rlscontract.SettleCharge, Hits: 150},
			rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "llm"}, {Key: "key", Value: "192.0.2.1"}}, HitsAddend: 150}},
		{"refund", rlscontract.Settlement{Rule: "llm", Composite: "192.0.2.1", Kind: rlscontract.SettleRefund, Amount: 30.5},
			rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "llm"}, {Key: "key", Value: "192.0.2.1"},
				{Key: "tokengate_settle", Value: "refund"}, {Key: "tokengate_amount", Value: "30.5"}}}},
		{"refund of a microtoken", rlscontract.Settlement{Rule: "llm", Composite: "k", Kind: rlscontract.SettleRefund, Amount: 0.000001},
			rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "llm"}, {Key: "key", Value: "k"},
				{Key: "tokengate_settle", Value: "refund"}, {Key: "tokengate_amount", Value: "0.000001"}}}},
		{"reset", rlscontract.Settlement{Rule: "login", Composite: "192.0.2.1", Kind: rlscontract.SettleReset},
			rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "login"}, {Key: "key", Value: "192.0.2.1"},
				{Key: "tokengate_settle", Value: "reset"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := rlscontract.SettlementDescriptor(tc.set)
			if !reflect.DeepEqual(d, tc.expected) {
				t.Fatalf("SettlementDescriptor:\ngot  %+v\nwant %+v", d, tc.expected)
			}
			s, err := rlscontract.ParseSettlement(d)
			if err != nil || s != tc.set {
				t.Errorf("ParseSettlement: got %+v %v, want %+v", s, err, tc.set)
			}
		})
	}
	// A charge without hits_addend: Hits 0, the call's applies.
	if s, err := rlscontract.ParseSettlement(rlscontract.Descriptor{Entries: entries{{Key: "tokengate_rule", Value: "r"}, {Key: "key", Value: "k"}}}); err != nil ||
		s != (rlscontract.Settlement{Rule: "r", Composite: "k", Kind: rlscontract.SettleCharge}) {
		t.Errorf("a charge without hits: got %+v %v", s, err)
	}
}

func TestParseSettlementRefuses(t *testing.T) {
	d := func(kv ...string) rlscontract.Descriptor {
		es := entries{{Key: "tokengate_rule", Value: "llm"}, {Key: "key", Value: "x"}}
		for i := 0; i < len(kv); i += 2 {
			es = append(es, rlscontract.Entry{Key: kv[i], Value: kv[i+1]})
		}
		return rlscontract.Descriptor{Entries: es}
	}
	for _, tc := range []struct {
		name        string
		input       rlscontract.Descriptor
		expectedErr string
	}{
		{"no rule", rlscontract.Descriptor{Entries: entries{{Key: "key", Value: "x"}}}, "a settlement descriptor starts with tokengate_rule and key"},
		{"the key first", rlscontract.Descriptor{Entries: entries{{Key: "key", Value: "x"}, {Key: "tokengate_rule", Value: "llm"}}},
			"a settlement descriptor starts with tokengate_rule and key"},
		{"a negative refund", d("tokengate_settle", "refund", "tokengate_amount", "-1"), `refund amount "-1": must be a number > 0`},
		{"a zero refund", d("tokengate_settle", "refund", "tokengate_amount", "0"), `refund amount "0": must be a number > 0`},
		{"a NaN refund", d("tokengate_settle", "refund", "tokengate_amount", "NaN"), `refund amount "NaN": must be a number > 0`},
		{"an infinite refund", d("tokengate_settle", "refund", "tokengate_amount", "Inf"), `refund amount "Inf": must be a number > 0`},
		{"a refund that is not a number", d("tokengate_settle", "refund", "tokengate_amount", "lots"), `refund amount "lots": must be a number > 0`},
		{"a refund without amount", d("tokengate_settle", "refund"), `settlement descriptor of rule "llm": unknown entries`},
		{"a reset with an amount", d("tokengate_settle", "reset", "tokengate_amount", "1"), `settlement descriptor of rule "llm": unknown entries`},
		{"an unknown kind", d("tokengate_settle", "double"), `settlement descriptor of rule "llm": unknown entries`},
		{"a lease descriptor", d("tokengate_mode", "lease"), `settlement descriptor of rule "llm": unknown entries`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s, err := rlscontract.ParseSettlement(tc.input); err == nil || err.Error() != tc.expectedErr {
				t.Errorf("got %+v %v, want %q", s, err, tc.expectedErr)
			}
		})
	}
}

// FuzzLeaseDescriptor: every lease the filter can send parses back to itself.
func FuzzLeaseDescriptor(f *testing.F) {
	f.Add("l", "k", "h", uint64(3), 1.5, uint64(10), false)
	f.Add("l", "k", "", uint64(0), 0.0, uint64(1), false)
	f.Add("l", "a\xffb", "h", uint64(1), 0.000001, uint64(0), true)
	f.Fuzz(func(t *testing.T, rule, comp, holder string, grant uint64, unspent float64, want uint64, release bool) {
		if len(holder) > 64 || strings.ContainsAny(holder, "{}") || unspent < 0 || math.IsInf(unspent, 0) || math.IsNaN(unspent) {
			t.Skip("not a lease the filter sends")
		}
		l := rlscontract.Lease{Rule: rule, Composite: strings.ToValidUTF8(comp, "\uFFFD"), Holder: holder, Grant: grant, Unspent: unspent, Want: want, Release: release}
		if l.Exact() {
			l.Grant, l.Unspent, l.Release = 0, 0, false
		}
		got, ok, err := rlscontract.ParseLease(rlscontract.LeaseDescriptor(l))
		if !ok || err != nil || got != l {
			t.Fatalf("got %+v %v %v, want %+v", got, ok, err, l)
		}
	})
}

// FuzzSettlementDescriptor: every settlement the filter can send parses
// back to itself.
func FuzzSettlementDescriptor(f *testing.F) {
	f.Add("llm", "k", 0, uint64(5), 0.0)
	f.Add("llm", "k", 1, uint64(0), 30.5)
	f.Add("llm", "k", 2, uint64(0), 0.0)
	f.Fuzz(func(t *testing.T, rule, comp string, kind int, hits uint64, amount float64) {
		s := rlscontract.Settlement{Rule: rule, Composite: strings.ToValidUTF8(comp, "\uFFFD")}
		switch kind {
		case 0:
			if hits == 0 {
				t.Skip("the filter sends no charge of 0")
			}
			s.Kind, s.Hits = rlscontract.SettleCharge, hits
		case 1:
			if !(amount > 0) || math.IsInf(amount, 0) {
				t.Skip("the filter sends no refund of 0")
			}
			s.Kind, s.Amount = rlscontract.SettleRefund, amount
		default:
			s.Kind = rlscontract.SettleReset
		}
		got, err := rlscontract.ParseSettlement(rlscontract.SettlementDescriptor(s))
		if err != nil || got != s {
			t.Fatalf("got %+v %v, want %+v", got, err, s)
		}
	})
}

// FuzzQuotaDescriptor: every cluster descriptor the filter can send, with
// or without an identity's limit, parses back to its rule, composite key
// and limit (invalid UTF-8 sent as U+FFFD).
func FuzzQuotaDescriptor(f *testing.F) {
	f.Add("q", "k", "2500", uint64(1))
	f.Add("q", "", "", uint64(0))
	f.Add("q", "a\xffb", "1\xff", uint64(7))
	f.Fuzz(func(t *testing.T, rule, comp, limit string, hits uint64) {
		d := rlscontract.QuotaDescriptor(rule, comp, limit, hits)
		gotRule, gotComp, gotLimit, ok := rlscontract.ParseCluster(d.Entries)
		wantComp, wantLimit := strings.ToValidUTF8(comp, "\uFFFD"), strings.ToValidUTF8(limit, "\uFFFD")
		if !ok || gotRule != rule || gotComp != wantComp || gotLimit != wantLimit || d.HitsAddend != hits {
			t.Fatalf("got %q %q %q %v (hits %d), want %q %q %q true (hits %d)", gotRule, gotComp, gotLimit, ok, d.HitsAddend, rule, wantComp, wantLimit, hits)
		}
	})
}
