package dropin

import (
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/dropin/rlsyaml"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// TestRatelimitEnvLimits: the limits' variables set the service's and the
// runtime directory's bounds, their defaults when unset; a value that is
// not a positive number, or in-flight descriptors below one call's, is
// refused naming the variable.
func TestRatelimitEnvLimits(t *testing.T) {
	e, err := ParseSettings(envOf())
	if err != nil {
		t.Fatal(err)
	}
	if e.limits != rls.DefaultLimits() || e.runtimeLimits != (rlsyaml.Limits{}).WithDefaults() {
		t.Errorf("defaults: got %+v %+v", e.limits, e.runtimeLimits)
	}
	e, err = ParseSettings(envOf("TOKENGATE_RLS_MAX_DESCRIPTORS", "8", "TOKENGATE_RLS_MAX_ENTRIES", "4", "TOKENGATE_RLS_MAX_ENTRY_BYTES", "100",
		"TOKENGATE_RLS_MAX_MESSAGE_BYTES", "65536", "TOKENGATE_RLS_MAX_STREAMS_PER_CONNECTION", "10", "TOKENGATE_RLS_MAX_INFLIGHT_DESCRIPTORS", "80",
		"TOKENGATE_RLS_MAX_RLQS_BUCKETS", "500", "TOKENGATE_RUNTIME_MAX_BYTES", "1000", "TOKENGATE_RUNTIME_MAX_DESCRIPTORS", "20"))
	if err != nil {
		t.Fatal(err)
	}
	want := rls.Limits{Descriptors: 8, Entries: 4, EntryBytes: 100, MsgBytes: 65536, StreamsPerConn: 10, InFlight: 80, RLQSBuckets: 500}
	if e.limits != want || e.runtimeLimits != (rlsyaml.Limits{Bytes: 1000, Descriptors: 20}) {
		t.Errorf("got %+v %+v, want %+v and 1000 bytes, 20 descriptors", e.limits, e.runtimeLimits, want)
	}
	for _, tc := range []struct {
		kv   []string
		want string
	}{
		{[]string{"TOKENGATE_RLS_MAX_DESCRIPTORS", "0"}, `TOKENGATE_RLS_MAX_DESCRIPTORS="0": want a positive whole number (default 64)`},
		{[]string{"TOKENGATE_RUNTIME_MAX_BYTES", "2MB"}, `TOKENGATE_RUNTIME_MAX_BYTES="2MB": want a positive whole number (default 2097152)`},
		{[]string{"TOKENGATE_RLS_MAX_INFLIGHT_DESCRIPTORS", "10", "TOKENGATE_RLS_MAX_DESCRIPTORS", "20"}, "must be at least TOKENGATE_RLS_MAX_DESCRIPTORS (20)"},
	} {
		if _, err := ParseSettings(envOf(tc.kv...)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.kv, err, tc.want)
		}
	}
}

// TestRatelimitEnvMaxConnections: TOKENGATE_RLS_MAX_CONNECTIONS sets the
// daemon's MaxConnections (daemon.DefaultMaxConnections when unset) and
// refuses what is not a positive number.
func TestRatelimitEnvMaxConnections(t *testing.T) {
	for _, tc := range []struct {
		kv   []string
		want int
		err  string
	}{
		{nil, daemon.DefaultMaxConnections, ""},
		{[]string{"TOKENGATE_RLS_MAX_CONNECTIONS", "300"}, 300, ""},
		{[]string{"TOKENGATE_RLS_MAX_CONNECTIONS", "0"}, 0, `TOKENGATE_RLS_MAX_CONNECTIONS="0": want a positive whole number (default 2048)`},
	} {
		e, err := ParseSettings(envOf(tc.kv...))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: got %v, want %q", tc.kv, err, tc.err)
			}
			continue
		}
		if err != nil || e.maxConns != tc.want {
			t.Errorf("%q: got %d, %v; want %d", tc.kv, e.maxConns, err, tc.want)
		}
	}
}
