package wasmhost

import (
	"sync/atomic"

	"github.com/tokengate/tokengate/sharedstate"
)

// CASStorm wraps s so that every Set fails with sharedstate.ErrCASMismatch
// (Status CAS_MISMATCH) without writing, as if another worker always won
// the race; Get passes through. sets, if not nil, counts the Set calls.
func CASStorm(s sharedstate.Store, sets *atomic.Int64) *sharedstate.FaultStore {
	return &sharedstate.FaultStore{
		Store: s,
		SetErr: func(string, []byte, uint32) error {
			if sets != nil {
				sets.Add(1)
			}
			return sharedstate.ErrCASMismatch
		},
	}
}

// FailingStore wraps s so that Get fails with getErr and Set with setErr
// (Status INTERNAL_FAILURE for errors other than the sharedstate ones); a
// nil error passes that call through.
func FailingStore(s sharedstate.Store, getErr, setErr error) *sharedstate.FaultStore {
	f := &sharedstate.FaultStore{Store: s}
	if getErr != nil {
		f.GetErr = func(string) error { return getErr }
	}
	if setErr != nil {
		f.SetErr = func(string, []byte, uint32) error { return setErr }
	}
	return f
}
