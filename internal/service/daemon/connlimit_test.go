package daemon

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestMaxConnections: with Settings.MaxConnections 2 the gRPC listener
// (listen) serves two connections; a third gets no answer while they stay
// open (its call ends at its own deadline, DeadlineExceeded), and the two
// keep working meanwhile; once one closes, the third is served.
func TestMaxConnections(t *testing.T) {
	ls, err := listen(Settings{GRPC: "127.0.0.1:0", MaxConnections: 2})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(ls[0]) }()
	defer gs.Stop()
	addr := ls[0].Addr().String()
	dial := func() *grpc.ClientConn {
		t.Helper()
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	check := func(c *grpc.ClientConn, d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	a, b, third := dial(), dial(), dial()
	defer a.Close()
	defer b.Close()
	defer third.Close()
	for _, c := range []*grpc.ClientConn{a, b} {
		if err := check(c, 10*time.Second); err != nil {
			t.Fatalf("one of the first two connections: %v", err)
		}
	}
	// Not accepted while two are open, however long it waits (the wait
	// is the test's choice, not a verdict on speed).
	if err := check(third, 300*time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("third connection while two are open: %v, want DeadlineExceeded (not accepted)", err)
	}
	for _, c := range []*grpc.ClientConn{a, b} {
		if err := check(c, 10*time.Second); err != nil {
			t.Fatalf("an open connection while the third waits: %v", err)
		}
	}
	a.Close()
	if err := check(third, 10*time.Second); err != nil {
		t.Fatalf("third connection once one closed: %v", err)
	}
}

// TestMaxConnectionsDefault: <= 0 is DefaultMaxConnections.
func TestMaxConnectionsDefault(t *testing.T) {
	ls, err := listen(Settings{GRPC: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer ls[0].Close()
	if got := cap(ls[0].(*limitListener).slots); got != DefaultMaxConnections {
		t.Errorf("slots %d, want %d", got, DefaultMaxConnections)
	}
}

// TestLimitListenerHammer: 20 goroutines × 5 connections opened and
// closed against a listener of 3: never more than 3 open on the server's
// side at once, and every one accepted in the end.
func TestLimitListenerHammer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := limitConnections(l, 3)
	defer ll.Close()
	const clients, each = 20, 5
	var open, most, accepted atomic.Int64
	go func() {
		for {
			c, err := ll.Accept()
			if err != nil {
				return
			}
			n := open.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			accepted.Add(1)
			go func() {
				_, _ = io.Copy(io.Discard, c) // until the client closes
				open.Add(-1)
				c.Close()
			}()
		}
	}()
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				c, err := net.Dial("tcp", ll.Addr().String())
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = c.Write([]byte{1})
				c.Close()
			}
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for accepted.Load() < clients*each && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got, m := accepted.Load(), most.Load(); got != clients*each || m > 3 {
		t.Errorf("accepted %d of %d, at most %d open at once; want all, at most 3", got, clients*each, m)
	}
}
