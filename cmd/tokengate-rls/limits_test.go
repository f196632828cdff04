package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// TestLimitFlags: the -max-* flags default to rls.DefaultLimits, set
// rls.Limits, and refuse 0 and in-flight descriptors below one call's.
func TestLimitFlags(t *testing.T) {
	o, err := parseOptions([]string{"-config", "x"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.limits.Limits(); got != rls.DefaultLimits() {
		t.Errorf("defaults: got %+v, want %+v", got, rls.DefaultLimits())
	}
	o, err = parseOptions([]string{"-config", "x", "-max-descriptors", "8", "-max-entries", "4", "-max-entry-bytes", "100", "-max-message-bytes", "65536",
		"-max-streams-per-connection", "10", "-max-inflight-descriptors", "80", "-max-rlqs-buckets", "500"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := rls.Limits{Descriptors: 8, Entries: 4, EntryBytes: 100, MsgBytes: 65536, StreamsPerConn: 10, InFlight: 80, RLQSBuckets: 500}
	if got := o.limits.Limits(); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-max-descriptors", "0"}, "-max-descriptors 0: want 1 to 2147483647"},
		{[]string{"-max-rlqs-buckets", "3000000000"}, "-max-rlqs-buckets 3000000000: want 1 to 2147483647"},
		{[]string{"-max-descriptors", "100", "-max-inflight-descriptors", "50"}, "-max-inflight-descriptors 50: must be at least -max-descriptors (100)"},
	} {
		_, err := parseOptions(append([]string{"-config", "x"}, tc.args...), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestSoftMemoryLimit: 90 % of TOKENGATE_RLS_MEMORY_LIMIT becomes the
// runtime's soft limit, unless GOMEMLIMIT is set; a value that is not
// bytes is an error.
func TestSoftMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    int64
		wantOK  bool
		wantErr string
	}{
		{"unset", nil, 0, false, ""},
		{"chart's 256Mi", map[string]string{"TOKENGATE_RLS_MEMORY_LIMIT": "268435456"}, 241591910, true, ""},
		{"GOMEMLIMIT wins", map[string]string{"TOKENGATE_RLS_MEMORY_LIMIT": "268435456", "GOMEMLIMIT": "100MiB"}, 0, false, ""},
		{"not bytes", map[string]string{"TOKENGATE_RLS_MEMORY_LIMIT": "256Mi"}, 0, false, `TOKENGATE_RLS_MEMORY_LIMIT="256Mi": want the memory limit in bytes`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := softMemoryLimit(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want || ok != tc.wantOK {
				t.Errorf("got %d %v %v, want %d %v", got, ok, err, tc.want, tc.wantOK)
			}
		})
	}
}

// TestMaxConnectionsFlag: -max-connections reaches daemon.Settings
// (daemon.DefaultMaxConnections by default) and refuses 0.
func TestMaxConnectionsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{{nil, daemon.DefaultMaxConnections}, {[]string{"-max-connections", "300"}, 300}} {
		o, err := parseOptions(append([]string{"-config", "x"}, tc.args...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		s, err := o.settings(slog.New(slog.DiscardHandler), nil)
		if err != nil {
			t.Fatal(err)
		}
		if s.MaxConnections != tc.want {
			t.Errorf("%q: MaxConnections %d, want %d", tc.args, s.MaxConnections, tc.want)
		}
	}
	if _, err := parseOptions([]string{"-config", "x", "-max-connections", "0"}, io.Discard); err == nil || !strings.Contains(err.Error(), "-max-connections 0: want 1 to 2147483647") {
		t.Errorf("-max-connections 0: got %v", err)
	}
}
