package sharedstate

import (
	"testing"

	"github.com/tokengate/tokengate/bucket"
)

func TestLocalFallback(t *testing.T) {
	host := NewMemStore(Envoy)
	unimplemented := &FaultStore{Store: host}
	switched := 0
	f := &LocalFallback{Host: unimplemented, OnFallback: func() { switched++ }}
	u := &Updater{Store: f}
	r := Request{Key: "tb:r:", Limit: bucket.Limit{Rate: 1, Burst: 2}, Cost: 1}

	// While the host implements shared data, it is used.
	if out := take(u, t0, r); !out.Allowed || host.Len() != 1 || f.Local() {
		t.Fatalf("host store: got %+v, %d host keys, local %v", out, host.Len(), f.Local())
	}
	// A host that answers UNIMPLEMENTED (APISIX) switches to VM-local state,
	// which limits exactly within this VM.
	unimplemented.GetErr = func(string) error { return ErrUnimplemented }
	unimplemented.SetErr = func(string, []byte, uint32) error { return ErrUnimplemented }
	for i, want := range []bool{true, true, false} {
		if out := take(u, t0, r); out.Allowed != want || out.Err != nil {
			t.Fatalf("local request %d: got %+v, want allowed %v", i, out, want)
		}
	}
	if !f.Local() || switched != 1 {
		t.Errorf("switched %d times, local %v; want once", switched, f.Local())
	}
}
