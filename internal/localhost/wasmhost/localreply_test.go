package wasmhost

import (
	"strings"
	"testing"
)

func TestBuildLocalReply(t *testing.T) {
	tests := []struct {
		name         string
		input        LocalReply
		grpc, head   bool
		expected     string
		expectedBody string
	}{
		{
			name:         "plain with body",
			input:        LocalReply{Status: 429, Body: []byte("slow down\n"), Headers: []Header{{"Retry-After", "1"}}, GRPCStatus: -1},
			expected:     ":status=429 retry-after=1 content-length=10 content-type=text/plain",
			expectedBody: "slow down\n",
		},
		{
			name:     "filter content-type kept",
			input:    LocalReply{Status: 429, Body: []byte("{}"), Headers: []Header{{"content-type", "application/json"}}, GRPCStatus: -1},
			expected: ":status=429 content-type=application/json content-length=2", expectedBody: "{}",
		},
		{
			name:     "empty body drops content headers",
			input:    LocalReply{Status: 403, Headers: []Header{{"content-type", "x/y"}, {"content-length", "5"}}, GRPCStatus: -1},
			expected: ":status=403",
		},
		{
			name:     "head has no body",
			input:    LocalReply{Status: 429, Body: []byte("abc"), GRPCStatus: -1},
			head:     true,
			expected: ":status=429 content-length=3 content-type=text/plain",
		},
		{
			name:     "grpc mapped status and message",
			input:    LocalReply{Status: 429, Body: []byte("too many 100%\n"), GRPCStatus: -1},
			grpc:     true,
			expected: ":status=200 content-type=application/grpc grpc-status=14 grpc-message=too many 100%25%0A",
		},
		{
			name:     "grpc explicit status",
			input:    LocalReply{Status: 429, GRPCStatus: 8},
			grpc:     true,
			expected: ":status=200 content-type=application/grpc grpc-status=8",
		},
		{
			name:     "grpc status from filter header wins",
			input:    LocalReply{Status: 403, Headers: []Header{{"grpc-status", "16"}}, GRPCStatus: 8},
			grpc:     true,
			expected: ":status=200 grpc-status=16 content-type=application/grpc",
		},
		{
			name:     "grpc unknown http status",
			input:    LocalReply{Status: 418, GRPCStatus: 99},
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
