package daemon

import (
	"net"
	"sync"
)

// DefaultMaxConnections is the most gRPC connections the service holds
// open at once by default (Settings.MaxConnections, -max-connections,
// the drop-in's TOKENGATE_RLS_MAX_CONNECTIONS, the chart's
// limits.maxConnections). Each open connection keeps gRPC's read and
// write buffers and two goroutines, about 80 KiB, so 2,048 of them stay
// near 160 MiB, under the chart's 256 MiB; an Envoy holds one connection
// per worker thread, so raise it (and the memory limit) for fleets of
// more than a few hundred Envoys.
const DefaultMaxConnections = 2048

// limitListener accepts at most n connections open at once: Accept waits
// while n are open, so that the next connection waits in the kernel's
// backlog (its client sees no answer, then its own timeout) while the open
// ones keep working, and is accepted when one closes.
//
// Why: every connection a caller opens costs memory whether or not it
// sends a call, and nothing bounded their number (issue 30: bounded work
// and memory per caller).
type limitListener struct {
	net.Listener
	slots chan struct{}
	done  chan struct{}
	once  sync.Once
}

func limitConnections(l net.Listener, n int) net.Listener {
	if n <= 0 {
		n = DefaultMaxConnections
	}
	return &limitListener{Listener: l, slots: make(chan struct{}, n), done: make(chan struct{})}
}

// Accept waits for a free slot, then for a connection.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, free: func() { <-l.slots }}, nil
}

// Close closes the listener and ends an Accept waiting for a slot.
func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn frees its slot once, on its first Close.
type limitConn struct {
	net.Conn
	once sync.Once
	free func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}
