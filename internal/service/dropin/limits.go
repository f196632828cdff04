package dropin

import (
	"fmt"
	"math"
	"strconv"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/dropin/rlsyaml"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// The drop-in's limits (docs/dropin.md#limits): tokengate-rls's
// -max-* flags as their environment variables (TOKENGATE_RLS_MAX_*), and
// the runtime directory's bounds.
var limitVars = []struct {
	name string
	def  int
	set  func(e *Settings, n int)
}{
	{"TOKENGATE_RLS_MAX_DESCRIPTORS", rls.DefaultMaxDescriptors, func(e *Settings, n int) { e.limits.Descriptors = n }},
	{"TOKENGATE_RLS_MAX_ENTRIES", rls.DefaultMaxEntries, func(e *Settings, n int) { e.limits.Entries = n }},
	{"TOKENGATE_RLS_MAX_ENTRY_BYTES", rls.DefaultMaxEntryBytes, func(e *Settings, n int) { e.limits.EntryBytes = n }},
	{"TOKENGATE_RLS_MAX_MESSAGE_BYTES", rls.DefaultMaxMessageBytes, func(e *Settings, n int) { e.limits.MsgBytes = n }},
	{"TOKENGATE_RLS_MAX_STREAMS_PER_CONNECTION", rls.DefaultMaxStreamsPerConn, func(e *Settings, n int) { e.limits.StreamsPerConn = uint32(n) }},
	{"TOKENGATE_RLS_MAX_INFLIGHT_DESCRIPTORS", rls.DefaultMaxInFlight, func(e *Settings, n int) { e.limits.InFlight = n }},
	{"TOKENGATE_RLS_MAX_RLQS_BUCKETS", rls.DefaultMaxRLQSBuckets, func(e *Settings, n int) { e.limits.RLQSBuckets = n }},
	{"TOKENGATE_RLS_MAX_CONNECTIONS", daemon.DefaultMaxConnections, func(e *Settings, n int) { e.maxConns = n }},
	{"TOKENGATE_RUNTIME_MAX_BYTES", rlsyaml.DefaultMaxBytes, func(e *Settings, n int) { e.runtimeLimits.Bytes = int64(n) }},
	{"TOKENGATE_RUNTIME_MAX_DESCRIPTORS", rlsyaml.DefaultMaxDescriptors, func(e *Settings, n int) { e.runtimeLimits.Descriptors = n }},
}

// readLimits reads limitVars: each a positive whole number, its default
// when unset or empty.
func (e *Settings) readLimits(get func(string) (string, bool)) error {
	for _, l := range limitVars {
		n := l.def
		if v, ok := get(l.name); ok && v != "" {
			var err error
			n, err = strconv.Atoi(v)
			if err != nil || n <= 0 || n > math.MaxInt32 {
				return fmt.Errorf("%s=%q: want a positive whole number (default %d)", l.name, v, l.def)
			}
		}
		l.set(e, n)
	}
	if e.limits.InFlight < e.limits.Descriptors {
		return fmt.Errorf("TOKENGATE_RLS_MAX_INFLIGHT_DESCRIPTORS=%d: must be at least TOKENGATE_RLS_MAX_DESCRIPTORS (%d)", e.limits.InFlight, e.limits.Descriptors)
	}
	return nil
}
