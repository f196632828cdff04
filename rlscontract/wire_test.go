package rlscontract_test

import (
	"math/rand/v2"
	"strconv"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokengate/tokengate/rlscontract"
)

// TestRLSWireMatchesGoControlPlane checks the guest's hand-written RLS
// encoding against go-control-plane's generated types: requests it encodes
// decode to the same RateLimitRequest, and responses go-control-plane
// encodes decode to the same fields.
func TestRLSWireMatchesGoControlPlane(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	// Any valid UTF-8 (proto3 strings must be), multi-byte runes included.
	str := func() string {
		rs := make([]rune, r.IntN(100))
		for i := range rs {
			rs[i] = rune(r.IntN(0xD000))
		}
		return string(rs)
	}
	for i := range 300 {
		domain := "d" + strconv.Itoa(i)
		var ds []rlscontract.Descriptor
		want := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: uint32(r.IntN(3))}
		for range r.IntN(4) {
			var d rlscontract.Descriptor
			wd := &ratelimitv3.RateLimitDescriptor{}
			for range 1 + r.IntN(3) {
				e := rlscontract.Entry{Key: str(), Value: str()}
				d.Entries = append(d.Entries, e)
				wd.Entries = append(wd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
			}
			if r.IntN(2) == 0 {
				d.HitsAddend = r.Uint64N(1 << 40)
				if d.HitsAddend > 0 {
					wd.HitsAddend = wrapperspb.UInt64(d.HitsAddend)
				}
			}
			ds = append(ds, d)
			want.Descriptors = append(want.Descriptors, wd)
		}
		got := &rlsv3.RateLimitRequest{}
		if err := proto.Unmarshal(rlscontract.AppendRequest(nil, domain, ds, want.HitsAddend), got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("request %d:\ngot  %v\nwant %v", i, got, want)
		}

		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(r.IntN(3))}
		for range r.IntN(4) {
			st := &rlsv3.RateLimitResponse_DescriptorStatus{
				Code:               rlsv3.RateLimitResponse_Code(r.IntN(3)),
				CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: str(), RequestsPerUnit: r.Uint32(), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(r.IntN(7))},
				LimitRemaining:     r.Uint32(),
				DurationUntilReset: &durationpb.Duration{Seconds: r.Int64N(1e6), Nanos: r.Int32N(1e9)},
			}
			if r.IntN(2) == 0 { // a lease grant (docs/lease.md)
				st.Quota = &rlsv3.RateLimitResponse_Quota{Requests: r.Uint32(), Id: str(),
					ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{ValidUntil: &timestamppb.Timestamp{Seconds: r.Int64N(1e10), Nanos: r.Int32N(1e9)}}}
			}
			resp.Statuses = append(resp.Statuses, st)
		}
		for range r.IntN(3) {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: str(), Value: str()})
		}
		resp.RawBody = []byte(str())
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		p, err := rlscontract.ParseResponse(b)
		if err != nil {
			t.Fatal(err)
		}
		if p.OverallCode != int(resp.OverallCode) || len(p.Statuses) != len(resp.Statuses) || len(p.Headers) != len(resp.ResponseHeadersToAdd) {
			t.Fatalf("response %d: %+v from %v", i, p, resp)
		}
		for j, s := range resp.Statuses {
			g := p.Statuses[j]
			d := s.DurationUntilReset
			if g.Code != int(s.Code) || g.Name != s.CurrentLimit.Name || g.RequestsPerUnit != s.CurrentLimit.RequestsPerUnit ||
				g.Unit != int(s.CurrentLimit.Unit) || g.LimitRemaining != s.LimitRemaining ||
				g.UntilReset != float64(d.Seconds)+float64(d.Nanos)/1e9 {
				t.Fatalf("status %d: %+v from %v", j, g, s)
			}
			if q := s.Quota; (q != nil) != g.HasQuota || q != nil && (g.Quota.Requests != q.Requests || g.Quota.ID != q.Id ||
				g.Quota.ValidUntil != float64(q.GetValidUntil().Seconds)+float64(q.GetValidUntil().Nanos)/1e9) {
				t.Fatalf("status %d quota: %+v from %v", j, g.Quota, q)
			}
		}
		for j, h := range resp.ResponseHeadersToAdd {
			if p.Headers[j] != [2]string{h.Key, h.Value} {
				t.Fatalf("header %d: %q from %v", j, p.Headers[j], h)
			}
		}
	}
	for _, bad := range [][]byte{{0x08}, {0x12, 0x05, 1}, {0x0b}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}} {
		if _, err := rlscontract.ParseResponse(bad); err == nil {
			t.Errorf("ParseResponse(%x) accepted a malformed message", bad)
		}
	}
	framed := rlscontract.Frame(nil, []byte("abc"))
	if m, err := rlscontract.Unframe(framed); err != nil || string(m) != "abc" {
		t.Errorf("Unframe(Frame) = %q %v", m, err)
	}
	if _, err := rlscontract.Unframe(append(framed, 'x')); err == nil {
		t.Error("a frame with trailing bytes was accepted")
	}
}

// FuzzParseResponse: any body the service's cluster answers with is
// decoded or refused, never a panic; a frame decodes to what it framed.
func FuzzParseResponse(f *testing.F) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
		Code: rlsv3.RateLimitResponse_OVER_LIMIT, LimitRemaining: 3, DurationUntilReset: &durationpb.Duration{Seconds: 1, Nanos: 5e8},
		Quota: &rlsv3.RateLimitResponse_Quota{Requests: 10, Id: "7"}}}}
	b, err := proto.Marshal(resp)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{0x08})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = rlscontract.ParseResponse(b)
		if m, err := rlscontract.Unframe(rlscontract.Frame(nil, b)); err != nil || string(m) != string(b) {
			t.Fatalf("Unframe(Frame(%x)) = %x %v", b, m, err)
		}
	})
}
