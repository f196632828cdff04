package rls

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/tokengate/tokengate/rlscontract"
)

// TestLeaseAnswerOnTheWire: the lease answer the service sends, marshalled
// as gRPC marshals it, is read by the filter's parser as the answer built.
func TestLeaseAnswerOnTheWire(t *testing.T) {
	for _, tc := range []struct {
		name         string
		input        rlscontract.LeaseAnswer
		grant, exact bool
	}{
		{"grant", rlscontract.LeaseAnswer{Remaining: 40, HasGrant: true, Grant: 7, Tokens: 12, ValidUntil: 1736940000.5}, true, false},
		{"grant over the limit", rlscontract.LeaseAnswer{OverLimit: true, Retry: 0.25, HasGrant: true, Grant: 3, ValidUntil: 1736940001}, true, false},
		{"release", rlscontract.LeaseAnswer{Remaining: 9}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := statusMessage(rlscontract.LeaseStatus(tc.input))
			b, err := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: st.Code, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st}})
			if err != nil {
				t.Fatal(err)
			}
			r, err := rlscontract.ParseResponse(b)
			if err != nil {
				t.Fatal(err)
			}
			got, err := rlscontract.ParseLeaseAnswer(&r, tc.grant, tc.exact)
			if err != nil || got != tc.input {
				t.Errorf("got %+v %v, want %+v", got, err, tc.input)
			}
		})
	}
}
