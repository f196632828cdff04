package rlscontract_test

import (
	"math/rand/v2"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokengate/tokengate/rlscontract"
)

// TestRLSWireJSONMatchesProtojson checks the guest's hand-written JSON form
// of the RLS messages (settings.rls.protocol "json") against protojson, what
// envoyproxy/ratelimit's /json and tokengate-rls's use: requests it writes
// unmarshal to the same RateLimitRequest, and responses protojson writes
// (camelCase or proto names, enums as names or numbers) decode to the same
// fields.
func TestRLSWireJSONMatchesProtojson(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	// Any valid UTF-8, control characters, quotes and backslashes included.
	str := func() string {
		rs := make([]rune, r.IntN(60))
		for i := range rs {
			switch r.IntN(4) {
			case 0:
				rs[i] = rune(r.IntN(0x20))
			case 1:
				rs[i] = []rune{'"', '\\', '/', 0x7f, 0x2028}[r.IntN(5)]
			case 2:
				rs[i] = 0x10000 + rune(r.IntN(0x1000)) // beyond the BMP: surrogate pairs if escaped
			default:
				rs[i] = rune(r.IntN(0xD000))
			}
		}
		return string(rs)
	}
	for i := range 300 {
		domain := str()
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
				d.HitsAddend = r.Uint64N(1 << 62)
				if d.HitsAddend > 0 {
					wd.HitsAddend = wrapperspb.UInt64(d.HitsAddend)
				}
			}
			ds = append(ds, d)
			want.Descriptors = append(want.Descriptors, wd)
		}
		b := rlscontract.AppendRequestJSON(nil, domain, ds, want.HitsAddend)
		got := &rlsv3.RateLimitRequest{}
		if err := protojson.Unmarshal(b, got); err != nil {
			t.Fatalf("request %d: protojson refused %s: %v", i, b, err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("request %d:\ngot  %v\nwant %v", i, got, want)
		}

		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(r.IntN(3))}
		for range r.IntN(4) {
			st := &rlsv3.RateLimitResponse_DescriptorStatus{
				Code:               rlsv3.RateLimitResponse_Code(r.IntN(3)),
				LimitRemaining:     r.Uint32(),
				DurationUntilReset: &durationpb.Duration{Seconds: r.Int64N(1e6), Nanos: r.Int32N(1e9)},
			}
			if r.IntN(4) > 0 {
				st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: str(), RequestsPerUnit: r.Uint32(), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(r.IntN(8))}
			}
			if r.IntN(2) == 0 { // a lease grant (docs/lease.md)
				st.Quota = &rlsv3.RateLimitResponse_Quota{Requests: r.Uint32(), Id: str(),
					ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{ValidUntil: &timestamppb.Timestamp{Seconds: r.Int64N(1e10), Nanos: r.Int32N(1e9)}}}
			}
			resp.Statuses = append(resp.Statuses, st)
		}
		for range r.IntN(3) {
			h := &corev3.HeaderValue{Key: str(), Value: str()}
			if r.IntN(3) == 0 {
				h.RawValue = []byte(str())
			}
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, h)
		}
		resp.RawBody = []byte(str())
		mo := protojson.MarshalOptions{UseProtoNames: r.IntN(2) == 0, UseEnumNumbers: r.IntN(3) == 0, Multiline: r.IntN(2) == 0}
		jb, err := mo.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		p, err := rlscontract.ParseResponseJSON(jb)
		if err != nil {
			t.Fatalf("response %d: %v\n%s", i, err, jb)
		}
		if p.OverallCode != int(resp.OverallCode) || len(p.Statuses) != len(resp.Statuses) || len(p.Headers) != len(resp.ResponseHeadersToAdd) {
			t.Fatalf("response %d: %+v from %s", i, p, jb)
		}
		for j, s := range resp.Statuses {
			g := p.Statuses[j]
			d := s.DurationUntilReset
			cl := s.GetCurrentLimit()
			if g.Code != int(s.Code) || g.Name != cl.GetName() || g.RequestsPerUnit != cl.GetRequestsPerUnit() ||
				g.Unit != int(cl.GetUnit()) || g.LimitRemaining != s.LimitRemaining ||
				!near(g.UntilReset, float64(d.Seconds)+float64(d.Nanos)/1e9) {
				t.Fatalf("status %d: %+v from %v", j, g, s)
			}
			if q := s.Quota; (q != nil) != g.HasQuota || q != nil && (g.Quota.Requests != q.Requests || g.Quota.ID != q.Id ||
				!near(g.Quota.ValidUntil, float64(q.GetValidUntil().Seconds)+float64(q.GetValidUntil().Nanos)/1e9)) {
				t.Fatalf("status %d quota: %+v from %v (%s)", j, g.Quota, q, jb)
			}
		}
		for j, h := range resp.ResponseHeadersToAdd {
			want := [2]string{h.Key, h.Value}
			if len(h.RawValue) > 0 {
				want[1] = string(h.RawValue) // as the binary form: raw_value wins when set
			}
			if p.Headers[j] != want {
				t.Fatalf("header %d: %q from %v", j, p.Headers[j], h)
			}
		}
	}
	for _, bad := range []string{``, `[]`, `{"overallCode":"MAYBE"}`, `{"statuses":{}}`, `{"statuses":[1]}`,
		`{"statuses":[{"durationUntilReset":"5"}]}`, `{"statuses":[{"limitRemaining":-1}]}`, `{"statuses":[{"limitRemaining":1.5}]}`,
		`{"responseHeadersToAdd":[{"key":1}]}`, `{"statuses":[{"quota":{"validUntil":"yesterday"}}]}`, `{"overallCode":"OK"`} {
		if _, err := rlscontract.ParseResponseJSON([]byte(bad)); err == nil {
			t.Errorf("ParseResponseJSON(%s) accepted a malformed message", bad)
		}
	}
	// Invalid UTF-8 goes out as U+FFFD, still a request protojson reads.
	b := rlscontract.AppendRequestJSON(nil, "d\xff", []rlscontract.Descriptor{{Entries: []rlscontract.Entry{{Key: "k", Value: "v\xc3"}}}}, 0)
	var got rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(b, &got); err != nil || got.Domain != "d\uFFFD" || got.Descriptors[0].Entries[0].Value != "v\uFFFD" {
		t.Errorf("%s: %v %v", b, &got, err)
	}
}

// near compares seconds read from decimal text with the exact value: equal
// within a few float64 ulps at 1e10 s (a timestamp), about 2 us.
func near(a, b float64) bool { return a-b <= 4e-6 && b-a <= 4e-6 }

// FuzzParseResponseJSON: any JSON body is decoded or refused, never a
// panic.
func FuzzParseResponseJSON(f *testing.F) {
	f.Add([]byte(`{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","durationUntilReset":"1.5s","quota":{"requests":10,"id":"7","validUntil":"2025-01-15T11:20:00.5Z"}}],"responseHeadersToAdd":[{"key":"a","rawValue":"Yg=="}]}`))
	f.Add([]byte(`{"overall_code":2,"statuses":[{"limit_remaining":4294967295}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = rlscontract.ParseResponseJSON(b)
	})
}
