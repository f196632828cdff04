package rlscontract_test

import (
	"math"
	"testing"

	"github.com/tokengate/tokengate/rlscontract"
)

// TestLeaseAnswerRoundTrip: every answer the service builds is read back
// by the filter as itself, for each kind of lease call.
func TestLeaseAnswerRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name         string
		input        rlscontract.LeaseAnswer
		grant, exact bool
	}{
		{"grant", rlscontract.LeaseAnswer{Remaining: 40, HasGrant: true, Grant: 7, Tokens: 12, ValidUntil: 1736940000.25}, true, false},
		{"renewal carrying over only", rlscontract.LeaseAnswer{Remaining: 0, HasGrant: true, Grant: 1, Tokens: 3, ValidUntil: 1736940001}, true, false},
		{"grant over the limit", rlscontract.LeaseAnswer{OverLimit: true, Retry: 0.125, HasGrant: true, Grant: math.MaxUint64, ValidUntil: 1736940000.5}, true, false},
		{"release", rlscontract.LeaseAnswer{Remaining: 99}, false, false},
		{"exact take admitted", rlscontract.LeaseAnswer{Remaining: 5}, false, true},
		{"exact take refused", rlscontract.LeaseAnswer{OverLimit: true, Retry: 2.5, Remaining: 0}, false, true},
		{"largest amounts", rlscontract.LeaseAnswer{Remaining: math.MaxUint32, HasGrant: true, Grant: 2, Tokens: math.MaxUint32, ValidUntil: 4102444800}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rlscontract.Response{OverallCode: rlscontract.CodeOK, Statuses: []rlscontract.Status{rlscontract.LeaseStatus(tc.input)}}
			got, err := rlscontract.ParseLeaseAnswer(&r, tc.grant, tc.exact)
			if err != nil || got != tc.input {
				t.Errorf("got %+v %v, want %+v", got, err, tc.input)
			}
		})
	}
}

// TestParseLeaseAnswerRefuses: the answers the filter does not apply, each
// with the reason it logs.
func TestParseLeaseAnswerRefuses(t *testing.T) {
	status := func(a rlscontract.LeaseAnswer) rlscontract.Status { return rlscontract.LeaseStatus(a) }
	withID := func(id string) rlscontract.Status {
		s := status(rlscontract.LeaseAnswer{HasGrant: true, Grant: 1, Tokens: 1})
		s.Quota.ID = id
		return s
	}
	for _, tc := range []struct {
		name         string
		statuses     []rlscontract.Status
		grant, exact bool
		expectedErr  string
	}{
		{"no status", nil, true, false, "lease answer with 0 statuses"},
		{"two statuses", []rlscontract.Status{status(rlscontract.LeaseAnswer{}), status(rlscontract.LeaseAnswer{})}, false, true, "lease answer with 2 statuses"},
		{"grant without a quota", []rlscontract.Status{status(rlscontract.LeaseAnswer{Remaining: 3})}, true, false, "lease answer without a quota"},
		{"grant id 0", []rlscontract.Status{withID("0")}, true, false, `lease grant id "0"`},
		{"grant id not a number", []rlscontract.Status{withID("x1")}, true, false, `lease grant id "x1"`},
		{"release with a bad quota", []rlscontract.Status{withID("")}, false, false, `lease grant id ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rlscontract.Response{Statuses: tc.statuses}
			got, err := rlscontract.ParseLeaseAnswer(&r, tc.grant, tc.exact)
			if err == nil || err.Error() != tc.expectedErr {
				t.Errorf("got %+v %v, want error %q", got, err, tc.expectedErr)
			}
		})
	}
	// An exact take's quota, if any, is not read.
	r := rlscontract.Response{Statuses: []rlscontract.Status{withID("bad")}}
	if got, err := rlscontract.ParseLeaseAnswer(&r, false, true); err != nil || got.HasGrant {
		t.Errorf("exact take with a quota: got %+v %v, want no grant and no error", got, err)
	}
}

// FuzzLeaseAnswer: every answer the service can build parses back to
// itself, and any body the filter receives is read or refused, never a
// panic.
func FuzzLeaseAnswer(f *testing.F) {
	f.Add(false, 0.0, uint32(40), true, uint64(7), uint32(12), 1736940000.25, []byte{})
	f.Add(true, 0.5, uint32(0), false, uint64(0), uint32(0), 0.0, []byte{0x12, 0x02, 0x08, 0x02})
	f.Fuzz(func(t *testing.T, over bool, retry float64, remaining uint32, hasGrant bool, grant uint64, tokens uint32, validUntil float64, body []byte) {
		if r, err := rlscontract.ParseResponse(body); err == nil {
			_, _ = rlscontract.ParseLeaseAnswer(&r, true, false)
			_, _ = rlscontract.ParseLeaseAnswer(&r, false, true)
		}
		if hasGrant && grant == 0 || math.IsNaN(retry) || math.IsNaN(validUntil) {
			t.Skip("not an answer the service builds")
		}
		a := rlscontract.LeaseAnswer{OverLimit: over, Retry: retry, Remaining: remaining, HasGrant: hasGrant}
		if hasGrant {
			a.Grant, a.Tokens, a.ValidUntil = grant, tokens, validUntil
		}
		r := rlscontract.Response{Statuses: []rlscontract.Status{rlscontract.LeaseStatus(a)}}
		got, err := rlscontract.ParseLeaseAnswer(&r, hasGrant, false)
		if err != nil || got != a {
			t.Fatalf("got %+v %v, want %+v", got, err, a)
		}
	})
}
