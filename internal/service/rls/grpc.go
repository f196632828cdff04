package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// DefaultStreamWorkers is the number of goroutines NewGRPCServer keeps to
// run calls: about the calls in flight at a few tens of thousands a second.
const DefaultStreamWorkers = 64

// flowWindow is the HTTP/2 flow-control window of a stream and of a
// connection.
const flowWindow = 1 << 20

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
//
// Flow-control windows are static, 1 MiB per stream and per connection:
// by default grpc-go estimates the bandwidth-delay product by sending a
// PING whenever data arrives and none is outstanding, about one per round
// trip, which for calls of a few hundred bytes is as many frames as the
// calls themselves (and a window update with each answer), to tune
// windows that such calls never fill. Envoy's HTTP/2 client sends no such
// pings either.
func NewGRPCServer(srv rlsv3.RateLimitServiceServer, workers uint32, opts ...grpc.ServerOption) *grpc.Server {
	o := []grpc.ServerOption{grpc.ForceServerCodecV2(NewCodec()),
		grpc.StaticStreamWindowSize(flowWindow), grpc.StaticConnWindowSize(flowWindow)}
	if workers > 0 {
		o = append(o, grpc.NumStreamWorkers(workers))
	}
	gs := grpc.NewServer(append(o, opts...)...)
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	return gs
}

// RLSService is the gRPC service of the rate-limit service API, one of
// the names the health service answers for.
const RLSService = "envoy.service.ratelimit.v3.RateLimitService"

// RegisterHealth registers the standard gRPC health service
// (grpc.health.v1.Health) on gs, answering for the whole server ("")
// and for RLSService: SERVING while ready says the service can decide,
// NOT_SERVING otherwise, and likewise for the extra service names (the
// drop-in's "ratelimit", envoyproxy/ratelimit's). Envoy's gRPC health
// checks and Kubernetes' grpc probes ask it.
func RegisterHealth(gs *grpc.Server, ready *Readiness, extra ...string) *health.Server {
	h := health.NewServer()
	healthpb.RegisterHealthServer(gs, h)
	ready.Watch(func(ok bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ok {
			st = healthpb.HealthCheckResponse_SERVING
		}
		h.SetServingStatus("", st)
		h.SetServingStatus(RLSService, st)
		for _, name := range extra {
			h.SetServingStatus(name, st)
		}
	})
	return h
}
