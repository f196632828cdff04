package dropin

import (
	"context"
	"log/slog"
	"sync"

	"google.golang.org/grpc"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/dropin/rlsxds"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// XDS is an xDS server as a source of rules (CONFIG_TYPE=GRPC_XDS_SOTW):
// the configuration is empty until the server sends one.
type XDS struct {
	// Conn is the connection to the xDS server; closed when the service
	// stops.
	Conn *grpc.ClientConn
	// Options are the client's; Follow sets Set and Logf.
	Options rlsxds.Options
	// ForceStart serves before the first configuration arrives
	// (FORCE_START_WITHOUT_INITIAL_CONFIG); otherwise, as
	// envoyproxy/ratelimit, the service waits for it.
	ForceStart bool
	// Log receives the client's complaints.
	Log *slog.Logger
}

var _ daemon.Rules = (*XDS)(nil)

// First is the empty configuration.
func (x *XDS) First() (*rls.Config, error) { return rls.NewDropinConfig(nil, x.Options.Dropin) }

// Follow runs the xDS client until ctx is done and, unless ForceStart,
// waits for its first configuration (start false: ctx ended first).
func (x *XDS) Follow(ctx context.Context, apply daemon.Apply) (bool, error) {
	first := make(chan struct{})
	var once sync.Once
	xo := x.Options
	xo.Conn = x.Conn
	xo.Set = func(c *rls.Config) { apply(c, nil); once.Do(func() { close(first) }) }
	xo.Logf = func(msg string) { x.Log.Warn("xds: " + msg) }
	go rlsxds.Run(ctx, xo)
	go func() { <-ctx.Done(); x.Conn.Close() }()
	if !x.ForceStart {
		select {
		case <-first:
		case <-ctx.Done():
			return false, nil
		}
	}
	return true, nil
}

// Poll does nothing: the server sends what changes.
func (x *XDS) Poll(daemon.Apply) {}

// Reload does nothing: the server sends what changes.
func (x *XDS) Reload(string, daemon.Apply) {}
