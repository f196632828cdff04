package rls

// The gRPC calls' metrics, counted by a stats handler.

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// StatsHandler returns the gRPC stats handler counting every call the
// server receives (tokengate_rls_grpc_*): calls in flight, calls and their
// durations by method and status code, including those gRPC refuses
// before any handler runs, such as a message above the size limit.
// ShouldRateLimit's counters are resolved beforehand; another method's,
// once, on its first call.
func (m *Metrics) StatsHandler() stats.Handler { return statsHandler{m} }

type statsHandler struct{ m *Metrics }

// otherMethod keys a call's counters in its context when the method is
// not ShouldRateLimit (whose calls carry nothing).
type otherMethod struct{}

func (h statsHandler) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if info.FullMethodName == rlsMethod {
		return ctx
	}
	c, ok := h.m.methods.Load(info.FullMethodName)
	if !ok {
		c, _ = h.m.methods.LoadOrStore(info.FullMethodName, h.m.methodCounters(info.FullMethodName))
	}
	return context.WithValue(ctx, otherMethod{}, c)
}

func (h statsHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s := s.(type) {
	case *stats.Begin:
		h.m.inFlight.Inc()
	case *stats.End:
		h.m.inFlight.Dec()
		c := h.m.rlsCalls
		if o, ok := ctx.Value(otherMethod{}).(*callCounters); ok {
			c = o
		}
		code := codes.OK
		if s.Error != nil {
			code = status.Code(s.Error)
		}
		if int(code) >= numGRPCCodes {
			code = codes.Unknown
		}
		c.calls[code].Inc()
		c.duration[code].Observe(s.EndTime.Sub(s.BeginTime).Seconds())
	}
}

func (statsHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (statsHandler) HandleConn(context.Context, stats.ConnStats)                       {}
