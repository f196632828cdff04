package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// DefaultStreamWorkers is the number of goroutines NewGRPCServer keeps to
// run calls: about the calls in flight at a few tens of thousands a second.
const DefaultStreamWorkers = 64

// NewGRPCServer returns a gRPC server for srv's RateLimitService, with
// workers goroutines kept to run its calls (0: grpc-go's default, a new
// goroutine per call) and the hand-written codec (codec.go), then opts.
//
// The workers are grpc-go's stream workers: a call runs on an idle one,
// or, when all are busy, on a new goroutine as without them. Without them
// every call starts on a fresh goroutine whose stack then grows (copied
// each time it doubles) down the decoding and the Redis round trip:
// about 7 % of the service's CPU under load. An idle worker keeps its
// grown stack, a few kilobytes; grpc-go replaces each after 65,536 calls.
func NewGRPCServer(srv rlsv3.RateLimitServiceServer, workers uint32, opts ...grpc.ServerOption) *grpc.Server {
	o := []grpc.ServerOption{grpc.ForceServerCodecV2(NewCodec())}
	if workers > 0 {
		o = append(o, grpc.NumStreamWorkers(workers))
	}
	gs := grpc.NewServer(append(o, opts...)...)
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	return gs
}
