package wasmhost_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// grpcEcho is a unary gRPC server written from the wire format: it answers
// "pong:<message>" with grpc-status 0 in the trailers, after delay.
func grpcEcho(t *testing.T, delay time.Duration) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.ProtoMajor != 2 || r.URL.Path != "/test.Echo/Say" || r.Header.Get("content-type") != "application/grpc" ||
			len(b) < 5 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
			w.Header().Set("grpc-status", "3")
			w.Header().Set("grpc-message", "bad request "+r.Proto+" "+r.URL.Path)
			return
		}
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		msg := append([]byte("pong:"), b[5:]...)
		frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
		w.Header().Set("content-type", "application/grpc")
		w.Header().Set("trailer", "grpc-status, grpc-message")
		_, _ = w.Write(append(frame, msg...))
		w.Header().Set("grpc-status", "0")
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// TestCallouts drives proxy_http_call and proxy_grpc_call from the test
// guest: each pauses its request, the call reports to the root context, and
// the guest makes the stream effective and continues it, as the filter
// will for the rate-limit service.
func TestCallouts(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("trailer", "x-trailer")
		_, _ = w.Write(append([]byte(r.Method+":"+r.Host+":"), b...))
		w.Header().Set("x-trailer", "t1")
	}))
	defer up.Close()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := closed.Addr().String()
	closed.Close()
	clusters := map[string]wasmhost.Cluster{
		"up":   {Address: strings.TrimPrefix(up.URL, "http://")},
		"grpc": {Address: grpcEcho(t, 0), HTTP2: true},
		// Answers after a minute: a call with a 50 ms timeout that came
		// back before then was ended by its timeout, however slow the
		// machine.
		"slow":    {Address: grpcEcho(t, time.Minute), HTTP2: true},
		"h1-only": {Address: strings.TrimPrefix(up.URL, "http://")},
		"dead":    {Address: deadAddr, HTTP2: true},
	}
	h, srv := newGuestHost(t, wasmhost.Options{Workers: 2, Clusters: clusters}, proxy.Options{PauseTimeout: 5 * time.Second})
	defer func() {
		if n := h.StrayContinues(); n != 0 {
			t.Errorf("%d stray continues: a call's report resumed a stream twice or a gone one", n)
		}
	}()

	tests := []struct {
		name, test, cluster string
		expected            string // in x-result
	}{
		{name: "http call", test: "http-call", cluster: "up", expected: "call=200/POST:up:ping/t1"},
		{name: "http call unknown cluster", test: "http-call", cluster: "nope", expected: "st=2"}, // BAD_ARGUMENT
		{name: "http call fails", test: "http-call", cluster: "dead", expected: "call=failed"},
		{name: "grpc call", test: "grpc-call", cluster: "grpc", expected: "grpc=pong:ping"},
		{name: "grpc unknown cluster", test: "grpc-call", cluster: "nope", expected: "st=4"}, // PARSE_FAILURE
		{name: "grpc timeout", test: "grpc-slow", cluster: "slow", expected: "close=4/4/"},
		{name: "grpc no connection", test: "grpc-call", cluster: "dead", expected: "close=14/14/"},
		{name: "grpc to an HTTP/1 cluster", test: "grpc-call", cluster: "h1-only", expected: "close=13/13/cluster h1-only has no HTTP/2"},
		{name: "grpc cancel", test: "grpc-cancel", cluster: "grpc", expected: "cancel=0/1"}, // then NOT_FOUND
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := do(t, srv, "GET", "/", map[string]string{"x-test": tc.test, "x-cluster": tc.cluster}, "")
			if r.status != 200 {
				t.Fatalf("status %d, body %q", r.status, r.body)
			}
			if got := r.header.Get("X-Result"); !strings.Contains(got, tc.expected) {
				t.Errorf("x-result %q, want it to contain %q", got, tc.expected)
			}
			if tc.test == "grpc-slow" && time.Since(start) > 30*time.Second {
				t.Errorf("a call with a 50 ms timeout held the request %v", time.Since(start))
			}
		})
	}
}

// TestTickResumesPausedStream pauses requests that a tick resumes: the
// guest sets a 20 ms period, the root context's proxy_on_tick makes each
// stream effective and continues it, then sets the period to 0.
func TestTickResumesPausedStream(t *testing.T) {
	h, srv := newGuestHost(t, wasmhost.Options{Workers: 1}, proxy.Options{PauseTimeout: 5 * time.Second})
	for i := range 3 {
		r := test(t, srv, "tick-resume")
		if r.status != 200 || !strings.Contains(r.header.Get("X-Result"), "ticked") {
			t.Fatalf("request %d: status %d, x-result %q", i, r.status, r.header.Get("X-Result"))
		}
	}
	if p := h.TickPeriod(0); p != 0 {
		t.Errorf("tick period %v after the last resume, want 0", p)
	}
}

// TestClientLeavesWhilePaused: when the client goes away from a held
// request, the host ends the stream (proxy_on_done, proxy_on_delete) and a
// later proxy_set_effective_context on it answers BAD_ARGUMENT, so the
// guest can never continue a stream that is gone.
func TestClientLeavesWhilePaused(t *testing.T) {
	// The pause timeout is far beyond the test's steps, however loaded the
	// machine: the client leaves before it, once the guest holds the
	// request (not after a fixed time, which a slow machine could spend
	// before the request even reaches the guest).
	h, srv := newGuestHost(t, wasmhost.Options{Workers: 1}, proxy.Options{PauseTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/", nil)
	req.Header.Set("x-test", "hold")
	answered := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("a held request answered %d", resp.StatusCode)
		} else {
			err = nil
		}
		answered <- err
	}()
	for held := time.Now().Add(20 * time.Second); h.GuestCalls()["proxy_on_request_headers"] == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(held) {
			t.Fatal("the guest never saw the held request")
		}
	}
	cancel()
	if err := <-answered; err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := test(t, srv, "effective-gone")
		got := r.header.Get("X-Result")
		if strings.Contains(got, "effective=2") && strings.Contains(got, "dones=1") {
			if n := h.StrayContinues(); n != 0 {
				t.Errorf("%d stray continues", n)
			}
			if s, c := h.InFlight(); s != 0 || c != 0 {
				t.Errorf("in flight after the answers: %d streams, %d callouts; want none (the one the client left ended)", s, c)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("x-result %q: want effective=2 (BAD_ARGUMENT) and dones=1", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStrayContinues: proxy_continue_stream with no stream effective, or on
// a request already continued, is counted (Host.StrayContinues), and the
// correct uses (TestCallouts, TestTickResumesPausedStream,
// TestClientLeavesWhilePaused, run first on their own hosts) count none.
func TestStrayContinues(t *testing.T) {
	h, srv := newGuestHost(t, wasmhost.Options{Workers: 1}, proxy.Options{PauseTimeout: 5 * time.Second})
	for i := range 3 {
		if r := test(t, srv, "tick-resume"); r.status != 200 {
			t.Fatalf("request %d: %d", i, r.status)
		}
	}
	if n := h.StrayContinues(); n != 0 {
		t.Fatalf("%d stray continues after ticks resumed three requests once each", n)
	}
	r := test(t, srv, "continue-stray")
	if got := r.header.Get("X-Result"); !strings.Contains(got, "none=0/2") || !strings.Contains(got, "first=0") || !strings.Contains(got, "again=0") {
		t.Errorf("x-result %q: want none=0/2 (BAD_ARGUMENT), first=0, again=0", got)
	}
	if n := h.StrayContinues(); n != 2 {
		t.Errorf("%d stray continues, want 2", n)
	}
}

// TestUnimplementedFunctions: ABI functions the host does not model answer
// UNIMPLEMENTED through one path, and the module still loads.
func TestUnimplementedFunctions(t *testing.T) {
	_, srv := newGuestHost(t, wasmhost.Options{Workers: 1})
	if got := test(t, srv, "unimplemented").header.Get("X-Result"); !strings.Contains(got, "queue=12") {
		t.Errorf("x-result %q, want queue=12", got)
	}
}
