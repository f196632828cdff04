// Package rlsxds is tokengate-rls's xDS configuration source, as
// envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW (what Envoy Gateway
// serves): a state-of-the-world ADS client
// (StreamAggregatedResources) for
// type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig. Each
// response is the whole configuration: all its resources (one domain
// each) replace the configuration in force, and are ACKed; a response
// with a bad resource is NACKed with the reason and the configuration in
// force is kept. A broken stream is reopened after a jittered,
// exponentially growing wait. docs/dropin.md#xds describes it.
package rlsxds

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/internal/service/rls"
)

// TypeURL is the resource type the client subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Options configure Run.
type Options struct {
	// Conn is the connection to the management server (with its TLS).
	Conn grpc.ClientConnInterface
	// NodeID is the xDS node's id (CONFIG_GRPC_XDS_NODE_ID).
	NodeID string
	// Dropin are the options of every configuration made (algorithm,
	// headers, ...).
	Dropin rls.DropinOptions
	// Set puts a new configuration in force.
	Set func(*rls.Config)
	// Logf, when not nil, is told about streams, NACKs and updates.
	Logf func(msg string)
	// Backoff is the first wait before reopening a broken stream
	// (default 1 s); it doubles up to MaxBackoff (default 60 s), each wait
	// drawn at random between half and all of it, and starts again
	// after a stream that delivered a configuration.
	Backoff, MaxBackoff time.Duration
}

// Run subscribes until ctx is done.
func Run(ctx context.Context, o Options) {
	if o.Backoff <= 0 {
		o.Backoff = time.Second
	}
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = max(60*time.Second, o.Backoff)
	}
	logf := o.Logf
	if logf == nil {
		logf = func(string) {}
	}
	wait := o.Backoff
	version := "" // the last version accepted, for NACKs and reconnects
	for ctx.Err() == nil {
		delivered, err := stream(ctx, o, &version, logf)
		if ctx.Err() != nil {
			return
		}
		if delivered {
			wait = o.Backoff
		}
		d := wait/2 + rand.N(wait/2+1)
		logf(fmt.Sprintf("stream ended (%v); reopening in %v", err, d.Round(time.Millisecond)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		wait = min(2*wait, o.MaxBackoff)
	}
}

// stream runs one ADS stream; delivered reports whether it put a
// configuration in force.
func stream(ctx context.Context, o Options, version *string, logf func(string)) (delivered bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(o.Conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	node := &corev3.Node{Id: o.NodeID}
	if err := s.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeURL, VersionInfo: *version}); err != nil {
		return false, err
	}
	for {
		resp, err := s.Recv()
		if err != nil {
			return delivered, err
		}
		req := &discoveryv3.DiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		if resp.GetTypeUrl() != TypeURL {
			req.VersionInfo = *version
			req.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "unexpected type " + resp.GetTypeUrl()}
		} else if cfg, n, err := decode(resp, o.Dropin); err != nil {
			req.VersionInfo = *version
			req.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
			logf("NACK version " + resp.GetVersionInfo() + ", the configuration in force is kept: " + err.Error())
		} else {
			o.Set(cfg)
			delivered = true
			*version = resp.GetVersionInfo()
			req.VersionInfo = *version
			logf(fmt.Sprintf("version %s in force: %d domains", *version, n))
		}
		if err := s.Send(req); err != nil {
			return delivered, err
		}
	}
}

// decode makes the configuration of all of a response's resources.
func decode(resp *discoveryv3.DiscoveryResponse, opt rls.DropinOptions) (*rls.Config, int, error) {
	var domains []*rls.Domain
	for i, a := range resp.GetResources() {
		var rc rlsconf.RateLimitConfig
		if a.GetTypeUrl() != TypeURL {
			return nil, 0, fmt.Errorf("resources[%d]: type %s, want %s", i, a.GetTypeUrl(), TypeURL)
		}
		if err := a.UnmarshalTo(&rc); err != nil {
			return nil, 0, fmt.Errorf("resources[%d]: %w", i, err)
		}
		d, err := Domain(&rc)
		if err != nil {
			return nil, 0, fmt.Errorf("resources[%d] (%s): %w", i, rc.GetName(), err)
		}
		domains = append(domains, d)
	}
	cfg, err := rls.NewDropinConfig(domains, opt)
	if err != nil {
		return nil, 0, err
	}
	return cfg, len(domains), nil
}

// Domain converts one RateLimitConfig resource.
func Domain(rc *rlsconf.RateLimitConfig) (*rls.Domain, error) {
	if rc.GetDomain() == "" {
		return nil, errors.New("domain: empty")
	}
	ds, err := descriptors(rc.GetDescriptors())
	if err != nil {
		return nil, err
	}
	return &rls.Domain{Name: rc.GetDomain(), Descriptors: ds}, nil
}

func descriptors(in []*rlsconf.RateLimitDescriptor) ([]*rls.Descriptor, error) {
	var out []*rls.Descriptor
	for _, d := range in {
		n := &rls.Descriptor{Key: d.GetKey(), Value: d.GetValue()}
		if p := d.GetRateLimit(); p != nil {
			rl := &rls.RateLimit{RequestsPerUnit: p.GetRequestsPerUnit(), Unlimited: p.GetUnlimited(), Name: p.GetName(),
				Shadow: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric()}
			if p.GetUnit() != rlsconf.RateLimitUnit_UNKNOWN {
				// By name, as envoyproxy/ratelimit converts it.
				u, ok := rlsv3.RateLimitResponse_RateLimit_Unit_value[p.GetUnit().String()]
				if !ok {
					return nil, fmt.Errorf("%s: unit %s", d.GetKey(), p.GetUnit())
				}
				rl.Unit = rls.Unit(u)
			}
			for _, r := range p.GetReplaces() {
				rl.Replaces = append(rl.Replaces, r.GetName())
			}
			n.RateLimit = rl
		}
		var err error
		if n.Descriptors, err = descriptors(d.GetDescriptors()); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}
