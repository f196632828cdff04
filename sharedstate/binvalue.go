//go:build !wasip1

package sharedstate

import (
	"encoding/binary"
	"errors"
	"math"

	"github.com/tokengate/tokengate/bucket"
)

// Binary values: a native host's store (sharedstate/procstore, behind the
// Envoy dynamic module) holds a bucket as 17 bytes plus the slot's owner
// instead of the "{tokens}:{last_refill}[:{owner}]" text, so that a
// decision formats and parses no decimals. The layout is one tag byte
// (binTag without an owner, binTagOwner with one), tokens and last_refill
// as little-endian float64 bits, then the owner's bytes. No text value
// starts with either tag (text starts with a digit or '-'), so every reader
// (parseValue, ParseState) tells the two apart by the first byte, and a
// store may hold both.
//
// The numbers are those the text would hold once parsed back: tokens
// floored to the microunit, last_refill a whole number of microseconds. A
// state the text holds differently (a debt, a count from 2^33 on, a
// last_refill that is not a quantized time) is written as text: the two
// formats always decode to the same state. None of this is linked into the
// wasm guest (binvalue_wasip1.go), whose hosts' shared data keeps the text.

const (
	// binaryValues: this build reads and writes binary values.
	binaryValues = true

	binTag      = 0xfe
	binTagOwner = 0xff
	binLen      = 17
)

// BinaryValues is implemented by a Store that accepts binary values
// (BinaryValues returns true): the Updater then writes the buckets of its
// decisions in that format. Both formats are always read.
type BinaryValues interface {
	BinaryValues() bool
}

// BinaryValues reports whether the host's store accepts binary values,
// while the fallback has not switched to its own store. The host's answer
// is asked once: Host must not change after the first decision.
func (f *LocalFallback) BinaryValues() bool {
	if f.local != nil {
		return false
	}
	if f.hostBinary == 0 {
		f.askHost()
	}
	return f.hostBinary == 2
}

// askHost sets hostBinary from the Host's answer (apart, so that
// BinaryValues inlines).
func (f *LocalFallback) askHost() {
	f.hostBinary = 1
	if b, ok := f.Host.(BinaryValues); ok && b.BinaryValues() {
		f.hostBinary = 2
	}
}

// appendStored appends the stored form of s for p: binary when st accepts
// it and s has an exact binary form, text otherwise. now is the decision's
// time, quantized (see binaryState).
func appendStored(st Store, dst []byte, p *pending, s bucket.State, now float64) []byte {
	var bin bool
	if f, ok := st.(*LocalFallback); ok { // the filter's store: no interface assertion
		bin = f.BinaryValues()
	} else if b, ok := st.(BinaryValues); ok {
		bin = b.BinaryValues()
	}
	if bin {
		if t, last, ok := binaryState(s, now); ok {
			return appendBinary(dst, t, last, p.owner, p.hasOwner)
		}
	}
	return p.value(dst, s)
}

// AppendBinaryValue appends the binary form of s (with owner when
// hasOwner) to dst, or its text form (AppendState, AppendSlotValue) when s
// has no exact binary form.
func AppendBinaryValue(dst []byte, s bucket.State, owner string, hasOwner bool) []byte {
	if t, last, ok := binaryState(s, 0); ok {
		return appendBinary(dst, t, last, owner, hasOwner)
	}
	if hasOwner {
		return AppendSlotValue(dst, s, owner)
	}
	return AppendState(dst, s)
}

// binaryState returns the tokens and last_refill the text of s parses
// back to, and false when s is outside the binary form's domain. now, if
// not 0, is a time Quantize returned: a last_refill equal to it is known to
// be a whole number of microseconds (floorMicro(now) == now: floorMicro is
// idempotent below maxFastMicro, TestFloorMicroIdempotent), which spares
// the common case a floorMicro.
func binaryState(s bucket.State, now float64) (t, last float64, ok bool) {
	t, last = s.Tokens, s.Last
	switch {
	case t > 0 && t < maxFastMicro:
		t = floorMicro(t)
	case t == 0: // and -0
		t = 0
	default: // a debt, NaN, ±Inf, from 2^33 on
		return 0, 0, false
	}
	if !(last > 0 && last < maxFastMicro) || last != now && floorMicro(last) != last {
		return 0, 0, false
	}
	return t, last, true
}

func appendBinary(dst []byte, t, last float64, owner string, hasOwner bool) []byte {
	tag := byte(binTag)
	if hasOwner {
		tag = binTagOwner
	}
	dst = append(dst, tag)
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(t))
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(last))
	if hasOwner {
		dst = append(dst, owner...)
	}
	return dst
}

var (
	errBinary      = errors.New("sharedstate: bad binary state")
	errBinaryOwner = errors.New("sharedstate: bad state: a binary slot value (with an owner)")
)

// parseBinary parses a binary value; binary false means b is not one (it
// is text, or empty). A binary value holding numbers the writer never
// writes (tokens outside [0, 2^33), last_refill outside (0, 2^33)) is an
// error, as a text value out of its grammar is.
func parseBinary(b []byte) (s bucket.State, owner []byte, hasOwner bool, err error, isBinary bool) {
	if len(b) == 0 || b[0] < binTag {
		return s, nil, false, nil, false
	}
	if len(b) < binLen || b[0] == binTag && len(b) != binLen {
		return s, nil, false, errBinary, true
	}
	s.Tokens = math.Float64frombits(binary.LittleEndian.Uint64(b[1:9]))
	s.Last = math.Float64frombits(binary.LittleEndian.Uint64(b[9:17]))
	if !(s.Tokens >= 0 && s.Tokens < maxFastMicro && s.Last > 0 && s.Last < maxFastMicro) {
		return bucket.State{}, nil, false, errBinary, true
	}
	if b[0] == binTagOwner {
		return s, b[binLen:], true, nil, true
	}
	return s, nil, false, nil, true
}
