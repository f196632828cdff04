package deploy

import (
	"testing"
)

// TestChartLimits: the memory limit reaches the binary as
// TOKENGATE_RLS_MEMORY_LIMIT from resources.limits.memory (90 % of which
// becomes its soft memory limit), not as GOMEMLIMIT at 100 %; the limits
// values render as the -max-* flags, and none by default (the binary's
// defaults, docs/rls.md#limits).
func TestChartLimits(t *testing.T) {
	_, c := rlsContainer(t, mustRender(t, ""))
	found := false
	for _, e := range c.Env {
		switch e.Name {
		case "GOMEMLIMIT":
			t.Errorf("env GOMEMLIMIT set by the chart: the binary sets 90 %% of TOKENGATE_RLS_MEMORY_LIMIT")
		case "TOKENGATE_RLS_MEMORY_LIMIT":
			found = true
			if e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil || e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" {
				t.Errorf("TOKENGATE_RLS_MEMORY_LIMIT: got %+v, want the container's limits.memory", e.ValueFrom)
			}
		}
	}
	if !found {
		t.Error("no TOKENGATE_RLS_MEMORY_LIMIT in the container's environment")
	}
	for _, a := range c.Args {
		if len(a) > 5 && a[:5] == "-max-" {
			t.Errorf("default args carry %s: want the binary's defaults", a)
		}
	}

	_, c = rlsContainer(t, mustRender(t, `
limits: {maxDescriptors: 16, maxEntries: 8, maxEntryBytes: 512, maxMessageBytes: 65536,
  maxStreamsPerConnection: 100, maxInflightDescriptors: 1000, maxRLQSBuckets: 5000, maxConnections: 300}
`))
	for _, want := range []string{"-max-descriptors=16", "-max-entries=8", "-max-entry-bytes=512", "-max-message-bytes=65536",
		"-max-streams-per-connection=100", "-max-inflight-descriptors=1000", "-max-rlqs-buckets=5000", "-max-connections=300"} {
		if !hasArg(c, want) {
			t.Errorf("args %q lack %s", c.Args, want)
		}
	}
}
