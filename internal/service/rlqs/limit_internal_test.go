package rlqs

import (
	"strconv"
	"strings"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestOverBuckets: a report is refused when the buckets the stream holds
// and the new ones it names would pass the limit; buckets it already
// holds count once.
func TestOverBuckets(t *testing.T) {
	id := func(i int) *rlqsv3.BucketId {
		return &rlqsv3.BucketId{Bucket: map[string]string{RuleKey: "r", "k": strconv.Itoa(i)}}
	}
	held := func(n int) map[string]*bucketState {
		m := map[string]*bucketState{}
		for i := range n {
			m[bucketMapKey(id(i))] = &bucketState{id: id(i)}
		}
		return m
	}
	report := func(from, to int) *rlqsv3.RateLimitQuotaUsageReports {
		m := &rlqsv3.RateLimitQuotaUsageReports{}
		for i := from; i < to; i++ {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: id(i)})
		}
		return m
	}
	for _, tc := range []struct {
		name       string
		held       int
		from, to   int
		max        int
		wantRefuse bool
	}{
		{"empty stream, report at the limit", 0, 0, 10, 10, false},
		{"empty stream, report past the limit", 0, 0, 11, 10, true},
		{"held buckets reported again", 10, 0, 10, 10, false},
		{"held and new at the limit", 8, 5, 10, 10, false},
		{"held and new past the limit", 8, 5, 11, 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := overBuckets(report(tc.from, tc.to), held(tc.held), tc.max)
			if !tc.wantRefuse {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "over the limit of "+strconv.Itoa(tc.max)+" buckets per stream (-max-rlqs-buckets)") {
				t.Fatalf("got %v, want RESOURCE_EXHAUSTED naming the limit", err)
			}
		})
	}
}
