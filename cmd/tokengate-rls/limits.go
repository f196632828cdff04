package main

import (
	"flag"
	"fmt"
	"math"
	"strconv"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// limitFlags are the -max-* flags: each caller's bounds and the calls in
// flight's (rls.Limits, docs/rls.md#limits).
type limitFlags struct {
	descriptors, entries, entryBytes, msgBytes, streams, inflight, rlqsBuckets uint
	// conns is -max-connections (daemon.Settings.MaxConnections).
	conns uint
}

func (l *limitFlags) flags(fs *flag.FlagSet) {
	fs.UintVar(&l.descriptors, "max-descriptors", rls.DefaultMaxDescriptors, "most descriptors in one RLS call; more: INVALID_ARGUMENT before any Redis work")
	fs.UintVar(&l.entries, "max-entries", rls.DefaultMaxEntries, "most entries in one descriptor; more: INVALID_ARGUMENT")
	fs.UintVar(&l.entryBytes, "max-entry-bytes", rls.DefaultMaxEntryBytes, "longest descriptor entry key or value, in bytes; longer: INVALID_ARGUMENT")
	fs.UintVar(&l.msgBytes, "max-message-bytes", rls.DefaultMaxMessageBytes, "largest gRPC message received, in bytes; larger: RESOURCE_EXHAUSTED, not decoded")
	fs.UintVar(&l.streams, "max-streams-per-connection", rls.DefaultMaxStreamsPerConn, "most concurrent gRPC calls and streams on one HTTP/2 connection")
	fs.UintVar(&l.inflight, "max-inflight-descriptors", rls.DefaultMaxInFlight, "most descriptors of all RLS calls in flight together; past it a call is refused RESOURCE_EXHAUSTED at once")
	fs.UintVar(&l.conns, "max-connections", daemon.DefaultMaxConnections, "most gRPC connections open at once; the next waits (unanswered) until one closes")
	fs.UintVar(&l.rlqsBuckets, "max-rlqs-buckets", rls.DefaultMaxRLQSBuckets, "most buckets one RLQS stream may report (ids naming no rule are not kept); past it the stream ends RESOURCE_EXHAUSTED")
}

// check reports a limit out of range.
func (l *limitFlags) check() error {
	for _, f := range []struct {
		name string
		v    uint
	}{{"max-descriptors", l.descriptors}, {"max-entries", l.entries}, {"max-entry-bytes", l.entryBytes}, {"max-message-bytes", l.msgBytes},
		{"max-streams-per-connection", l.streams}, {"max-inflight-descriptors", l.inflight}, {"max-rlqs-buckets", l.rlqsBuckets},
		{"max-connections", l.conns}} {
		if f.v == 0 || f.v > math.MaxInt32 {
			return fmt.Errorf("-%s %d: want 1 to %d", f.name, f.v, math.MaxInt32)
		}
	}
	if l.inflight < l.descriptors {
		return fmt.Errorf("-max-inflight-descriptors %d: must be at least -max-descriptors (%d)", l.inflight, l.descriptors)
	}
	return nil
}

// Limits are the flags as rls.Limits.
func (l *limitFlags) Limits() rls.Limits {
	return rls.Limits{Descriptors: int(l.descriptors), Entries: int(l.entries), EntryBytes: int(l.entryBytes), MsgBytes: int(l.msgBytes),
		StreamsPerConn: uint32(l.streams), InFlight: int(l.inflight), RLQSBuckets: int(l.rlqsBuckets)}
}

// memoryLimitEnv is the environment variable that gives the service its
// container's memory limit, in bytes (the chart sets it from
// resources.limits.memory); memoryLimitFraction of it becomes the Go
// runtime's soft memory limit, unless GOMEMLIMIT is set.
//
// Why not GOMEMLIMIT at the container's limit, as the chart set before:
// the runtime's limit counts only the memory it manages, not the rest of
// the resident set (stacks of threads in cgo, the binary's own pages), so
// at 100 % the garbage collector lets the process reach the kill line; and
// the binary's GOGC of 400 lets a heap of 50 MB (a large drop-in
// configuration) grow to 250 MB between collections.
const (
	memoryLimitEnv      = "TOKENGATE_RLS_MEMORY_LIMIT"
	memoryLimitFraction = 0.9
)

// softMemoryLimit returns the runtime's soft memory limit the environment
// asks for (lookup: os.LookupEnv): memoryLimitFraction of
// TOKENGATE_RLS_MEMORY_LIMIT, or ok false when GOMEMLIMIT is set or the
// variable is not.
func softMemoryLimit(lookup func(string) (string, bool)) (limit int64, ok bool, err error) {
	if _, set := lookup("GOMEMLIMIT"); set {
		return 0, false, nil
	}
	v, set := lookup(memoryLimitEnv)
	if !set || v == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, false, fmt.Errorf("environment %s=%q: want the memory limit in bytes", memoryLimitEnv, v)
	}
	return int64(float64(n) * memoryLimitFraction), true, nil
}
