package rls

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A decider answers ShouldRateLimit's valid calls for one kind of
// configuration. Each Config carries the one it was made for, so the kind
// is chosen once, when the configuration is made, and never by looking
// at a call.
type decider interface {
	decide(ctx context.Context, s *Server, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)
}

// tokengateKind decides a tokengate JSON configuration (ParseConfig): the
// filter's cluster rules, its lease calls and settlements, and the
// rls_descriptors trees.
type tokengateKind struct{ c *Config }

func (k tokengateKind) decide(ctx context.Context, s *Server, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.shouldTokengate(ctx, k.c, req)
}

// dropinKind decides envoyproxy/ratelimit's configuration
// (NewDropinConfig, dropin_server.go).
type dropinKind struct{ d *dropin }

func (k dropinKind) decide(ctx context.Context, s *Server, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.shouldDropin(ctx, k.d, req)
}

// errUnloaded answers every call while no configuration is loaded
// (Unloaded): envoyproxy/ratelimit's words.
const errUnloaded = "no rate limit configuration loaded"

// unloadedKind answers every call with an error (Unloaded).
type unloadedKind struct{}

func (unloadedKind) decide(_ context.Context, s *Server, _ *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.metrics.request(reqUnavailable)
	return nil, status.Error(codes.Unknown, errUnloaded)
}
