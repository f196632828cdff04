package rlscontract

import (
	"encoding/binary"
	"errors"
	"math"
)

// The binary form of the messages (settings.rls.protocol "grpc", the
// default): the request encoded and the response decoded by hand, in
// protobuf's wire format, so that the guest carries no protobuf runtime.
// The field numbers are those of envoy/service/ratelimit/v3/rls.proto and
// envoy/extensions/common/ratelimit/v3/ratelimit.proto; wire_test.go checks
// them against go-control-plane's generated types. Frame and Unframe are
// unary gRPC's message framing.

// Entry is one key/value pair of a descriptor.
type Entry struct{ Key, Value string }

// Descriptor is a RateLimitDescriptor: its entries and its hits_addend
// (0: not sent, the request's applies).
type Descriptor struct {
	Entries    []Entry
	HitsAddend uint64
}

// AppendRequest appends a RateLimitRequest{domain, descriptors, hits_addend}.
func AppendRequest(dst []byte, domain string, ds []Descriptor, hitsAddend uint32) []byte {
	dst = appendString(dst, 1, domain)
	for _, d := range ds {
		dst = appendTag(dst, 2, wireBytes)
		dst = appendVarint(dst, uint64(descriptorSize(d)))
		for _, e := range d.Entries {
			dst = appendTag(dst, 1, wireBytes)
			dst = appendVarint(dst, uint64(entrySize(e)))
			dst = appendString(dst, 1, e.Key)
			dst = appendString(dst, 2, e.Value)
		}
		if d.HitsAddend > 0 {
			dst = appendTag(dst, 3, wireBytes)
			dst = appendVarint(dst, uint64(1+varintSize(d.HitsAddend)))
			dst = appendTag(dst, 1, wireVarint)
			dst = appendVarint(dst, d.HitsAddend)
		}
	}
	if hitsAddend > 0 {
		dst = appendTag(dst, 3, wireVarint)
		dst = appendVarint(dst, uint64(hitsAddend))
	}
	return dst
}

func entrySize(e Entry) int { return stringSize(1, e.Key) + stringSize(2, e.Value) }

func descriptorSize(d Descriptor) int {
	n := 0
	for _, e := range d.Entries {
		s := entrySize(e)
		n += 1 + varintSize(uint64(s)) + s
	}
	if d.HitsAddend > 0 {
		n += 1 + 1 + 1 + varintSize(d.HitsAddend)
	}
	return n
}

// Codes of RateLimitResponse.Code.
const (
	CodeUnknown   = 0
	CodeOK        = 1
	CodeOverLimit = 2
)

// Status is a DescriptorStatus.
type Status struct {
	_    incomparable
	Code int
	// RequestsPerUnit and Unit are current_limit's (Unit: 1 second, 2
	// minute, 3 hour, 4 day, 5 month, 6 year); Name its name.
	RequestsPerUnit uint32
	Unit            int
	Name            string
	LimitRemaining  uint32
	// UntilReset is duration_until_reset in seconds.
	UntilReset float64
	// Quota is the status's quota (field 5), a lease grant in tokengate's
	// lease mode (docs/lease.md); HasQuota says whether it was present.
	Quota    Quota
	HasQuota bool
}

// Quota is a RateLimitResponse.Quota: requests granted, the grant's id,
// and valid_until in seconds since the Unix epoch (0: absent).
type Quota struct {
	_          incomparable
	Requests   uint32
	ID         string
	ValidUntil float64
}

// Response is the part of a RateLimitResponse the filter uses.
type Response struct {
	OverallCode int
	Statuses    []Status
	// Headers are response_headers_to_add (value, or raw_value if set).
	Headers [][2]string
}

var errMalformed = errors.New("rlscontract: malformed message")

// ParseResponse decodes a RateLimitResponse. Unknown fields are skipped.
func ParseResponse(b []byte) (Response, error) {
	var r Response
	err := fields(b, func(num int, wt int, v uint64, data []byte) error {
		switch {
		case num == 1 && wt == wireVarint:
			r.OverallCode = int(v)
		case num == 2 && wt == wireBytes:
			s, err := parseStatus(data)
			if err != nil {
				return err
			}
			r.Statuses = append(r.Statuses, s)
		case num == 3 && wt == wireBytes:
			var k, val string
			raw := false
			err := fields(data, func(num int, wt int, _ uint64, d []byte) error {
				switch {
				case num == 1 && wt == wireBytes:
					k = string(d)
				case num == 2 && wt == wireBytes && !raw:
					val = string(d)
				case num == 3 && wt == wireBytes && len(d) > 0:
					val, raw = string(d), true
				}
				return nil
			})
			if err != nil {
				return err
			}
			r.Headers = append(r.Headers, [2]string{k, val})
		}
		return nil
	})
	return r, err
}

func parseStatus(b []byte) (Status, error) {
	var s Status
	err := fields(b, func(num int, wt int, v uint64, data []byte) error {
		switch {
		case num == 1 && wt == wireVarint:
			s.Code = int(v)
		case num == 2 && wt == wireBytes:
			return fields(data, func(num int, wt int, v uint64, d []byte) error {
				switch {
				case num == 1 && wt == wireVarint:
					s.RequestsPerUnit = uint32(v)
				case num == 2 && wt == wireVarint:
					s.Unit = int(v)
				case num == 3 && wt == wireBytes:
					s.Name = string(d)
				}
				return nil
			})
		case num == 3 && wt == wireVarint:
			s.LimitRemaining = uint32(v)
		case num == 4 && wt == wireBytes:
			var err error
			s.UntilReset, err = seconds(data)
			return err
		case num == 5 && wt == wireBytes:
			s.HasQuota = true
			return fields(data, func(num int, wt int, v uint64, d []byte) error {
				switch {
				case num == 1 && wt == wireVarint:
					s.Quota.Requests = uint32(v)
				case num == 3 && wt == wireBytes:
					s.Quota.ID = string(d)
				case num == 2 && wt == wireBytes:
					var err error
					s.Quota.ValidUntil, err = seconds(d)
					return err
				}
				return nil
			})
		}
		return nil
	})
	return s, err
}

// seconds decodes a google.protobuf.Duration or Timestamp (seconds = 1,
// nanos = 2) into seconds.
func seconds(b []byte) (float64, error) {
	var sec, nanos int64
	err := fields(b, func(num int, wt int, v uint64, _ []byte) error {
		switch {
		case num == 1 && wt == wireVarint:
			sec = int64(v)
		case num == 2 && wt == wireVarint:
			nanos = int64(int32(v))
		}
		return nil
	})
	return float64(sec) + float64(nanos)/1e9, err
}

// Frame prefixes a message for unary gRPC: no compression, 4-byte
// big-endian length.
func Frame(dst, msg []byte) []byte {
	dst = append(dst, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(msg)))
	return append(dst, msg...)
}

// Unframe returns the one message of a unary gRPC response body.
func Unframe(b []byte) ([]byte, error) {
	if len(b) < 5 || b[0] != 0 {
		return nil, errors.New("rlscontract: not an uncompressed gRPC message")
	}
	n := binary.BigEndian.Uint32(b[1:5])
	if uint64(n) != uint64(len(b)-5) {
		return nil, errors.New("rlscontract: gRPC frame length does not match the body")
	}
	return b[5:], nil
}

const (
	wireVarint = 0
	wire64     = 1
	wireBytes  = 2
	wire32     = 5
)

func appendTag(dst []byte, num, wt int) []byte { return appendVarint(dst, uint64(num)<<3|uint64(wt)) }

func appendVarint(dst []byte, v uint64) []byte {
	for v >= 0x80 {
		dst = append(dst, byte(v)|0x80)
		v >>= 7
	}
	return append(dst, byte(v))
}

func varintSize(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func appendString(dst []byte, num int, s string) []byte {
	if s == "" {
		return dst
	}
	dst = appendTag(dst, num, wireBytes)
	dst = appendVarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func stringSize(num int, s string) int {
	if s == "" {
		return 0
	}
	return varintSize(uint64(num)<<3) + varintSize(uint64(len(s))) + len(s)
}

// fields walks a message, calling f with each field's number, wire type,
// varint value and (for length-delimited fields) bytes.
func fields(b []byte, f func(num, wt int, v uint64, data []byte) error) error {
	for len(b) > 0 {
		tag, n := varint(b)
		if n == 0 || tag>>3 == 0 || tag>>3 > math.MaxInt32 {
			return errMalformed
		}
		b = b[n:]
		num, wt := int(tag>>3), int(tag&7)
		var v uint64
		var data []byte
		switch wt {
		case wireVarint:
			if v, n = varint(b); n == 0 {
				return errMalformed
			}
			b = b[n:]
		case wire64:
			if len(b) < 8 {
				return errMalformed
			}
			b = b[8:]
		case wire32:
			if len(b) < 4 {
				return errMalformed
			}
			b = b[4:]
		case wireBytes:
			l, n := varint(b)
			if n == 0 || l > uint64(len(b)-n) {
				return errMalformed
			}
			data, b = b[n:n+int(l)], b[n+int(l):]
		default:
			return errMalformed
		}
		if err := f(num, wt, v, data); err != nil {
			return err
		}
	}
	return nil
}

// varint reads a varint; n is 0 if b does not hold a valid one.
func varint(b []byte) (v uint64, n int) {
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			if i == 9 && b[i] > 1 {
				return 0, 0
			}
			return v, i + 1
		}
	}
	return 0, 0
}

// incomparable is a zero-width field that makes a struct not comparable
// (as net/http's): the compiler then generates no equality function for
// it, which the wasm module would carry (a few hundred bytes each, with its
// function table entries) though nothing compares the struct. Put it first:
// last, a zero-width field adds padding.
type incomparable [0]func()
