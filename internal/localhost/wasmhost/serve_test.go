package wasmhost

import (
	"strings"
	"testing"
	"time"
)

func TestBuildLocalReply(t *testing.T) {
	tests := []struct {
		name         string
		input        localReply
		grpc, head   bool
		expected     string
		expectedBody string
	}{
		{
			name:         "plain with body",
			input:        localReply{status: 429, body: []byte("slow down\n"), headers: []Header{{"Retry-After", "1"}}, grpcStatus: -1},
			expected:     ":status=429 retry-after=1 content-length=10 content-type=text/plain",
			expectedBody: "slow down\n",
		},
		{
			name:     "filter content-type kept",
			input:    localReply{status: 429, body: []byte("{}"), headers: []Header{{"content-type", "application/json"}}, grpcStatus: -1},
			expected: ":status=429 content-type=application/json content-length=2", expectedBody: "{}",
		},
		{
			name:     "empty body drops content headers",
			input:    localReply{status: 403, headers: []Header{{"content-type", "x/y"}, {"content-length", "5"}}, grpcStatus: -1},
			expected: ":status=403",
		},
		{
			name:     "head has no body",
			input:    localReply{status: 429, body: []byte("abc"), grpcStatus: -1},
			head:     true,
			expected: ":status=429 content-length=3 content-type=text/plain",
		},
		{
			name:     "grpc mapped status and message",
			input:    localReply{status: 429, body: []byte("too many 100%\n"), grpcStatus: -1},
			grpc:     true,
			expected: ":status=200 content-type=application/grpc grpc-status=14 grpc-message=too many 100%25%0A",
		},
		{
			name:     "grpc explicit status",
			input:    localReply{status: 429, grpcStatus: 8},
			grpc:     true,
			expected: ":status=200 content-type=application/grpc grpc-status=8",
		},
		{
			name:     "grpc status from filter header wins",
			input:    localReply{status: 403, headers: []Header{{"grpc-status", "16"}}, grpcStatus: 8},
			grpc:     true,
			expected: ":status=200 grpc-status=16 content-type=application/grpc",
		},
		{
			name:     "grpc unknown http status",
			input:    localReply{status: 418, grpcStatus: 99},
			grpc:     true,
			expected: ":status=200 content-type=application/grpc grpc-status=2",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hs, body := buildLocalReply(&tc.input, tc.grpc, tc.head)
			var parts []string
			for _, h := range hs {
				parts = append(parts, h.Name+"="+h.Value)
			}
			if got := strings.Join(parts, " "); got != tc.expected {
				t.Errorf("headers:\ngot  %s\nwant %s", got, tc.expected)
			}
			if string(body) != tc.expectedBody {
				t.Errorf("body: got %q, want %q", body, tc.expectedBody)
			}
		})
	}
}

func TestFakeClock(t *testing.T) {
	start := time.Unix(1_700_000_000, 250)
	c := NewFakeClock(start)
	steps := []struct {
		move     func()
		wallSec  int64
		wallNsec int32
		mono     int64
	}{
		{func() {}, 1_700_000_000, 250, 1},
		{func() { c.Advance(1500 * time.Millisecond) }, 1_700_000_001, 500_000_250, 1_500_000_001},
		{func() { c.Advance(-time.Second) }, 1_700_000_000, 500_000_250, 1_500_000_001},
		{func() { c.Set(start.Add(3 * time.Second)) }, 1_700_000_003, 250, 4_000_000_001},
		{func() { c.Set(time.Unix(-1, 0)) }, -1, 0, 4_000_000_001},
	}
	for i, s := range steps {
		s.move()
		sec, nsec := c.Walltime()
		if sec != s.wallSec || nsec != s.wallNsec || c.Nanotime() != s.mono {
			t.Errorf("step %d: got wall %d.%09d mono %d, want %d.%09d mono %d", i, sec, nsec, c.Nanotime(), s.wallSec, s.wallNsec, s.mono)
		}
	}
}

// TestIsGRPC: the local host tells gRPC requests by Envoy's rule, as the
// filter does, so Application/GRPC gets a gRPC local reply here too.
func TestIsGRPC(t *testing.T) {
	for ct, want := range map[string]bool{"application/grpc": true, "Application/GRPC": true, "application/grpc+proto": true,
		"application/grpc;x=1": true, "application/grpc-web": false, "application/grpcx": false, "": false} {
		if got := isGRPC(ct); got != want {
			t.Errorf("isGRPC(%q) = %v, want %v", ct, got, want)
		}
	}
}
