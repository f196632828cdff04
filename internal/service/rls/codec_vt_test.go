//go:build vtprotobuf

package rls

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestVTMarshalUsed: built with the vtprotobuf tag, as the Makefile builds
// the service and its tests, the codec sends what go-control-plane's
// vtprotobuf encoder writes, not proto.Marshal's.
func TestVTMarshalUsed(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for range 200 {
		resp := randResponse(r)
		want, err := resp.MarshalVTStrict()
		if err != nil {
			t.Fatal(err)
		}
		if got := marshal(t, resp); !bytes.Equal(got, want) {
			t.Fatalf("%v: codec wrote %x, vtprotobuf %x", resp, got, want)
		}
	}
}
