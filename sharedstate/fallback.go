package sharedstate

import (
	"errors"
)

// ErrUnimplemented reports that the host has no shared data (Status
// UNIMPLEMENTED), as APISIX's wasm-nginx-module answers.
var ErrUnimplemented = errors.New("shared data: not implemented by the host")

// LocalFallback is a Store that uses the host's shared data until the host
// answers ErrUnimplemented, and from then on a store private to this VM.
// On such a host limits are per worker instead of per proxy, which is
// better than not limiting at all. Like Updater, it is used by one
// goroutine at a time.
type LocalFallback struct {
	Host Store
	// OnFallback, if set, is called once, when the switch happens.
	OnFallback func()

	local *MemStore
	// hostBinary caches the Host's BinaryValues answer (binvalue.go): 0
	// not asked yet, 1 text, 2 binary. An interface type assertion on
	// every decision costs more than the rest of BinaryValues.
	hostBinary uint8
}

// Local reports whether the store has switched to VM-local state.
func (f *LocalFallback) Local() bool { return f.local != nil }

func (f *LocalFallback) fallBack() {
	f.local = NewMemStore(Envoy)
	if f.OnFallback != nil {
		f.OnFallback()
	}
}

// Get implements Store. (The err == nil tests spare the common case a call
// of errors.Is, which the wasm guest pays on every request.)
func (f *LocalFallback) Get(key string) ([]byte, uint32, error) {
	if f.local == nil {
		v, cas, err := f.Host.Get(key)
		if err == nil || !errors.Is(err, ErrUnimplemented) {
			return v, cas, err
		}
		f.fallBack()
	}
	return f.local.Get(key)
}

// Set implements Store.
func (f *LocalFallback) Set(key string, value []byte, cas uint32) error {
	if f.local == nil {
		err := f.Host.Set(key, value, cas)
		if err == nil || !errors.Is(err, ErrUnimplemented) {
			return err
		}
		f.fallBack()
	}
	return f.local.Set(key, value, cas)
}
