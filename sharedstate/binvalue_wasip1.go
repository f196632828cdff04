//go:build wasip1

package sharedstate

import "github.com/tokengate/tokengate/bucket"

// The wasm guest's hosts keep text values (see binvalue.go): these are
// constant answers the compiler folds away.

const binaryValues = false

func appendStored(_ Store, dst []byte, p *pending, s bucket.State, _ float64) []byte {
	return p.value(dst, s)
}

func parseBinary([]byte) (s bucket.State, owner []byte, hasOwner bool, err error, isBinary bool) {
	return s, nil, false, nil, false
}

var errBinaryOwner error
