package rlqs

import (
	"fmt"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultMaxBuckets is the most buckets one stream may report by default
// (Options.MaxBuckets, tokengate-rls -max-rlqs-buckets).
const DefaultMaxBuckets = 20000

// SetMaxBuckets sets the most buckets one stream may report (<= 0: the
// default); call it before serving.
func (s *Server) SetMaxBuckets(n int) { s.opt.MaxBuckets = n }

// maxBuckets is Options.MaxBuckets or its default.
func (s *Server) maxBuckets() int {
	if s.opt.MaxBuckets > 0 {
		return s.opt.MaxBuckets
	}
	return DefaultMaxBuckets
}

// overBuckets returns the RESOURCE_EXHAUSTED error that ends a stream
// whose report m would take it past max buckets (held: the buckets the
// stream keeps, keyed by bucketMapKey), naming the limit; or nil. Bucket
// ids that name no rule are not kept (report answers and forgets them),
// so they count only within their report.
//
// Why: a stream kept every bucket id it was sent, so 200,000 ids that
// named no rule held about 240 MB after the stream ended (issue 30).
func overBuckets(m *rlqsv3.RateLimitQuotaUsageReports, held map[string]*bucketState, max int) error {
	usages := m.GetBucketQuotaUsages()
	n := len(usages)
	if len(held)+n > max {
		n = len(held)
		for _, u := range usages {
			if held[bucketMapKey(u.GetBucketId())] == nil {
				n++
			}
		}
	}
	if len(usages) > max || n > max {
		return status.Error(codes.ResourceExhausted, fmt.Sprintf("report of %d buckets on a stream holding %d: over the limit of %d buckets per stream (-max-rlqs-buckets)", len(usages), len(held), max))
	}
	return nil
}
