package rls

import (
	"fmt"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits bound the work and the memory of one caller's call and of all
// calls in flight (docs/rls.md#limits). Every field is > 0 once
// WithDefaults has filled it; the defaults are far above what a proxy
// sends (the filter sends one descriptor per cluster rule, Envoy one
// descriptor per rate_limits action, a few entries each) and far below
// what hurts the service.
//
// Why: without them one call of 20,000 descriptors became one Redis
// pipeline of 20,000 scripts, longer than -redis-timeout, which tripped
// the per-node guard ("node not answering") for every other caller, and
// four calls of 100,000 descriptors took the service past its memory
// limit (issue 30).
type Limits struct {
	// Descriptors is the most descriptors one RLS call may carry
	// (-max-descriptors); a call with more is refused INVALID_ARGUMENT
	// before any Redis work.
	Descriptors int
	// Entries is the most entries one descriptor may carry
	// (-max-entries).
	Entries int
	// EntryBytes is the longest key and the longest value of an entry, in
	// bytes (-max-entry-bytes).
	EntryBytes int
	// MsgBytes is gRPC's largest message received, in bytes
	// (-max-message-bytes, grpc.MaxRecvMsgSize): bigger messages are
	// refused RESOURCE_EXHAUSTED by grpc-go before they are decoded.
	MsgBytes int
	// StreamsPerConn is the most concurrent gRPC streams (calls) of one
	// HTTP/2 connection (-max-streams-per-connection,
	// grpc.MaxConcurrentStreams); a client queues or opens another
	// connection past it.
	StreamsPerConn uint32
	// InFlight is the most descriptors all RLS calls in flight may carry
	// together (-max-inflight-descriptors): a call that would go past it
	// is refused RESOURCE_EXHAUSTED at once, without waiting, so that
	// memory and Redis work stay bounded however many callers there are.
	InFlight int
	// RLQSBuckets is the most buckets one RLQS stream may report
	// (-max-rlqs-buckets): a report that would take the stream past it
	// ends the stream RESOURCE_EXHAUSTED. Bucket ids that name no rule
	// are answered and not kept, so they count only within their report.
	RLQSBuckets int
}

// Default limits (docs/rls.md#limits).
const (
	DefaultMaxDescriptors    = 64
	DefaultMaxEntries        = 32
	DefaultMaxEntryBytes     = 4096
	DefaultMaxMessageBytes   = 1 << 20
	DefaultMaxStreamsPerConn = 1024
	DefaultMaxInFlight       = 16384
	DefaultMaxRLQSBuckets    = 20000
)

// DefaultLimits are the limits of a service started without flags.
func DefaultLimits() Limits { return Limits{}.WithDefaults() }

// WithDefaults returns l with every field <= 0 set to its default.
func (l Limits) WithDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.Descriptors, DefaultMaxDescriptors)
	def(&l.Entries, DefaultMaxEntries)
	def(&l.EntryBytes, DefaultMaxEntryBytes)
	def(&l.MsgBytes, DefaultMaxMessageBytes)
	def(&l.InFlight, DefaultMaxInFlight)
	def(&l.RLQSBuckets, DefaultMaxRLQSBuckets)
	if l.StreamsPerConn == 0 {
		l.StreamsPerConn = DefaultMaxStreamsPerConn
	}
	return l
}

// ServerOptions are the gRPC server options that enforce l: the codec
// that stops decoding a request past l's counts, the largest message and
// the streams per connection. NewGRPCServer's caller passes them; as they
// come after its own options, this codec replaces NewCodec's (grpc-go
// applies options in order).
func (l Limits) ServerOptions() []grpc.ServerOption {
	l = l.WithDefaults()
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(NewCodecLimits(l)),
		grpc.MaxRecvMsgSize(l.MsgBytes),
		grpc.MaxConcurrentStreams(l.StreamsPerConn),
	}
}

// check returns the INVALID_ARGUMENT error of a request past l's counts
// or sizes (the codec decodes at most one descriptor or entry past them),
// naming the limit, or nil.
func (l *Limits) check(req *rlsv3.RateLimitRequest) error {
	if n := len(req.Descriptors); n > l.Descriptors {
		return status.Error(codes.InvalidArgument, fmt.Sprintf("more than %d descriptors in one call: over the limit (-max-descriptors)", l.Descriptors))
	}
	for i, d := range req.Descriptors {
		if len(d.GetEntries()) > l.Entries {
			return status.Error(codes.InvalidArgument, fmt.Sprintf("descriptors[%d]: more than %d entries: over the limit (-max-entries)", i, l.Entries))
		}
		for j, e := range d.GetEntries() {
			if len(e.GetKey()) > l.EntryBytes || len(e.GetValue()) > l.EntryBytes {
				return status.Error(codes.InvalidArgument, fmt.Sprintf("descriptors[%d].entries[%d]: key or value longer than %d bytes: over the limit (-max-entry-bytes)", i, j, l.EntryBytes))
			}
		}
	}
	return nil
}

// admission counts the descriptors of the calls in flight against
// Limits.InFlight: a weighted semaphore that never waits.
type admission struct {
	held atomic.Int64
}

// acquire takes n of max, or reports false and takes nothing.
func (a *admission) acquire(n, max int64) bool {
	if a.held.Add(n) > max {
		a.held.Add(-n)
		return false
	}
	return true
}

func (a *admission) release(n int64) { a.held.Add(-n) }

// errInFlight is the error of a call refused by admission control.
func errInFlight(max int) error {
	return status.Error(codes.ResourceExhausted, fmt.Sprintf("more than %d descriptors in flight across the service: over the limit (-max-inflight-descriptors); retry", max))
}
