package redisstore

import (
	"context"
	"crypto/tls"
	"net"
	"time"

	"github.com/redis/rueidis"
)

// Connection timing, derived from the store's timeout (docs/failures.md).
// rueidis gives up a connection whose PING, sent after pingGap without an
// answer to anything, is not answered within connTimeout; until then the
// commands of calls that timed out stay queued on it (guard.go).
func (s *Store) pingGap() time.Duration { return max(4*s.opt.Timeout, 100*time.Millisecond) }
func (s *Store) connTimeout() time.Duration {
	// rueidis also cuts a lone call (one in flight) at this, whatever its
	// context: a call under its client's deadline must fit.
	return max(s.maxClientBudget()+s.opt.Timeout, 100*time.Millisecond)
}

// ringScale is rueidis's RingScaleEachConn: each connection queues up to
// 2^ringScale commands awaiting answers (guard.go's laneLimit).
const ringScale = 12

// clientOption is the rueidis configuration of the store.
func (s *Store) clientOption() rueidis.ClientOption {
	o := rueidis.ClientOption{
		InitAddress:       s.opt.Addrs,
		ForceSingleClient: !s.opt.Cluster && s.opt.SentinelMaster == "",
		DisableCache:      true,
		// The store retries itself, within the call's deadline, and only
		// what certainly did not run (Store.retryable).
		DisableRetry: true,
		Username:     s.opt.Username,
		Password:     s.opt.Password,
		TLSConfig:    s.opt.TLS,
		// The handshake (TLS, HELLO with AUTH) of a new connection is
		// bounded by the call that needs it and by this.
		Dialer: net.Dialer{Timeout: max(s.opt.Timeout, 500*time.Millisecond), KeepAlive: s.pingGap()},
		// An unresponsive Redis is noticed by the request deadlines; the
		// connection itself is given up after this (see pingGap).
		ConnWriteTimeout:  s.connTimeout(),
		RingScaleEachConn: ringScale,
		// Pipelining: concurrent calls' commands share a connection
		// and its writes. One connection per node (rueidis's default
		// for a cluster; for one node it would open up to four, one
		// per pair of CPUs): more commands per write system call,
		// which was 15 % of the service's CPU, and Redis, single-
		// threaded, reads them in fewer calls too.
		PipelineMultiplex: -1,
		MaxFlushDelay:     s.opt.FlushDelay,
		DialCtxFn:         s.dialFn(),
	}
	if s.opt.SentinelMaster != "" {
		o.Sentinel = rueidis.SentinelOption{
			MasterSet: s.opt.SentinelMaster,
			Username:  s.opt.SentinelUsername,
			Password:  s.opt.SentinelPassword,
			TLSConfig: s.opt.SentinelTLS,
			Dialer:    o.Dialer,
		}
	}
	return o
}

// connect makes the client, retrying every 250 ms until Redis answers once;
// from then on rueidis reconnects by itself, and the store reads the
// cluster's slot map every second (topology.go).
func (s *Store) connect() {
	defer close(s.done)
	for {
		c, err := rueidis.NewClient(s.clientOption())
		if err != nil {
			// For Ping (the readiness log): why there is no client yet.
			// rueidis's errors name the address, never the credentials.
			s.connectErr.Store(&err)
		}
		if err == nil {
			s.client.Store(&c)
			if !s.opt.Cluster {
				s.lanes.one.watch(func(ctx context.Context) error { return c.Do(ctx, c.B().Ping().Build()).Error() })
			}
			break
		}
		select {
		case <-s.stop:
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
	if !s.opt.Cluster {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s.refreshTopology()
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// dialFn is the dialer for Network "unix", else nil (rueidis's own).
func (s *Store) dialFn() func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	if s.opt.Network != "unix" {
		return nil
	}
	return func(ctx context.Context, dst string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
		c, err := d.DialContext(ctx, "unix", dst)
		if err != nil || cfg == nil {
			return c, err
		}
		return tls.Client(c, cfg), nil
	}
}

// Close stops connecting and closes the client.
func (s *Store) Close() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	if c := s.client.Load(); c != nil {
		(*c).Close()
	}
}
