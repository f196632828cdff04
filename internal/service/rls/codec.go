package rls

import (
	"errors"
	"fmt"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Codec is grpc-go's "proto" codec, except that it decodes a
// RateLimitRequest by hand, with protowire and the field numbers of
// Envoy's envoy/service/ratelimit/v3/rls.proto and
// envoy/extensions/common/ratelimit/v3/ratelimit.proto (as rlscontract
// does for the guest, in the other direction), and encodes with
// go-control-plane's vtprotobuf code when the build has it (Marshal).
// Under load, protobuf's reflection-driven (un)marshalling was about an
// eighth of the service's CPU. go-control-plane's vtprotobuf code has no
// decoder, hence ours. The decoded requests are those of proto.Unmarshal
// (codec_test.go checks them against each other): every field Envoy
// sends, unknown fields kept, merges of repeated message fields, and
// proto3's UTF-8 check on strings. Any other message goes to the
// standard codec.
type Codec struct {
	std encoding.CodecV2
	lim decodeLimits
}

// decodeLimits bound what the decoder builds of one request: at most
// descriptors+1 descriptors and entries+1 entries of each (0: no bound).
// The one past the limit is what tells ShouldRateLimit that the request
// went past it (Limits.check); the rest is skipped, not allocated, so a
// message of 100,000 descriptors costs what one of 65 does.
type decodeLimits struct{ descriptors, entries int }

// NewCodec returns the codec without limits; grpc.ForceServerCodecV2
// installs it.
func NewCodec() Codec { return Codec{std: encoding.GetCodecV2(protocodec.Name)} }

// NewCodecLimits returns the codec decoding at most one descriptor past
// l.Descriptors and one entry past l.Entries of each (Limits.ServerOptions
// installs it): a request past them is not the one sent, and is refused.
func NewCodecLimits(l Limits) Codec {
	c := NewCodec()
	c.lim = decodeLimits{descriptors: l.Descriptors, entries: l.Entries}
	return c
}

// Name is the standard codec's: the content-subtype is unchanged.
func (Codec) Name() string { return protocodec.Name }

// vtMarshaler is the method go-control-plane's vtprotobuf code
// (rls_vtproto.pb.go and its siblings) gives every message when the
// program is built with the vtprotobuf tag, as the Makefile builds it.
type vtMarshaler interface{ MarshalVTStrict() ([]byte, error) }

// Marshal encodes v: with its vtprotobuf encoder when the build has one
// (the RateLimitResponse the service answers, about three times faster
// than proto.Marshal: docs/rls.md#the-codec), otherwise with the standard
// codec.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(vtMarshaler); ok {
		b, err := m.MarshalVTStrict()
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.std.Marshal(v)
}

// Unmarshal decodes data into v.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return c.std.Unmarshal(data, v)
	}
	if len(data) == 1 {
		return unmarshalRequest(data[0].ReadOnlyData(), r, c.lim)
	}
	return unmarshalRequest(data.Materialize(), r, c.lim)
}

var errInvalidUTF8 = errors.New("string field contains invalid UTF-8")

// malformed is proto.Unmarshal's verdict on bytes that are not protobuf.
func malformed(what string) error {
	return fmt.Errorf("rls: cannot parse invalid wire-format data (%s)", what)
}

// field reads one field's tag and value from b and returns the rest. For
// a varint v is its value; for a length-delimited field data is its bytes;
// raw is the encoded value (for unknown fields).
func field(b []byte) (num protowire.Number, typ protowire.Type, v uint64, data, raw, rest []byte, err error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num > protowire.MaxValidNumber {
		return 0, 0, 0, nil, nil, nil, malformed("tag")
	}
	b = b[n:]
	var m int
	switch typ {
	case protowire.VarintType:
		v, m = protowire.ConsumeVarint(b)
	case protowire.BytesType:
		data, m = protowire.ConsumeBytes(b)
	default:
		m = protowire.ConsumeFieldValue(num, typ, b)
	}
	if m < 0 {
		return 0, 0, 0, nil, nil, nil, malformed(fmt.Sprintf("field %d", num))
	}
	return num, typ, v, data, b[:m], b[m:], nil
}

// appendUnknown keeps an unknown field as proto.Unmarshal does: its tag
// encoded anew (in the fewest bytes), its value as it came.
func appendUnknown(unknown []byte, num protowire.Number, typ protowire.Type, raw []byte) []byte {
	return append(protowire.AppendTag(unknown, num, typ), raw...)
}

// reqDecoder decodes one request. Its strings are substrings of s, one
// copy of the whole message (grpc reuses the buffer): one allocation
// instead of one per string.
type reqDecoder struct {
	buf []byte
	s   string
	lim decodeLimits
}

// str is a proto3 string field's value, data being a part of d.buf: valid
// UTF-8, as proto.Unmarshal demands.
func (d *reqDecoder) str(data []byte) (string, error) {
	if !utf8.Valid(data) {
		return "", errInvalidUTF8
	}
	if len(data) == 0 {
		return "", nil
	}
	if d.s == "" {
		d.s = string(d.buf)
	}
	off := cap(d.buf) - cap(data) // data is d.buf[off:off+len(data)]
	return d.s[off : off+len(data)], nil
}

// UnmarshalRequest decodes a RateLimitRequest as proto.Unmarshal does.
func UnmarshalRequest(b []byte, r *rlsv3.RateLimitRequest) error {
	return unmarshalRequest(b, r, decodeLimits{})
}

// bounded is n capped at one past limit (0: no limit).
func bounded(n, limit int) int {
	if limit > 0 && n > limit+1 {
		return limit + 1
	}
	return n
}

func unmarshalRequest(b []byte, r *rlsv3.RateLimitRequest, lim decodeLimits) error {
	d := reqDecoder{buf: b, lim: lim}
	r.Domain, r.Descriptors, r.HitsAddend = "", nil, 0
	max := 0
	if n := count(b, 2); n > 0 {
		max = bounded(n, lim.descriptors)
		r.Descriptors = make([]*ratelimitv3.RateLimitDescriptor, 0, max)
	}
	var unknown []byte
	for len(b) > 0 {
		num, typ, v, data, raw, rest, err := field(b)
		if err != nil {
			return err
		}
		b = rest
		switch {
		case num == 1 && typ == protowire.BytesType:
			if r.Domain, err = d.str(data); err != nil {
				return err
			}
		case num == 2 && typ == protowire.BytesType:
			if len(r.Descriptors) == max {
				continue // past the limit: skipped
			}
			desc := new(ratelimitv3.RateLimitDescriptor)
			if err := d.descriptor(data, desc); err != nil {
				return err
			}
			r.Descriptors = append(r.Descriptors, desc)
		case num == 3 && typ == protowire.VarintType:
			r.HitsAddend = uint32(v)
		default:
			unknown = appendUnknown(unknown, num, typ, raw)
		}
	}
	setUnknown(r, unknown)
	return nil
}

// count returns how many length-delimited fields numbered num b holds at
// its top level (to size a slice once); it stops at the first malformed
// field, which the decoding proper reports.
func count(b []byte, num protowire.Number) int {
	n := 0
	for len(b) > 0 {
		fnum, typ, _, _, _, rest, err := field(b)
		if err != nil {
			break
		}
		if fnum == num && typ == protowire.BytesType {
			n++
		}
		b = rest
	}
	return n
}

// setUnknown stores a message's unknown fields (only when there are some:
// proto.Unmarshal leaves none otherwise).
func setUnknown(m proto.Message, unknown []byte) {
	if len(unknown) > 0 {
		m.ProtoReflect().SetUnknown(unknown)
	}
}

// mergeUnknown appends to the unknown fields of a message that an earlier
// occurrence of the same field may have begun (a merge).
func mergeUnknown(m proto.Message, unknown []byte) {
	if len(unknown) > 0 {
		r := m.ProtoReflect()
		r.SetUnknown(append(r.GetUnknown(), unknown...))
	}
}

func (d *reqDecoder) descriptor(b []byte, desc *ratelimitv3.RateLimitDescriptor) error {
	max := 0
	if n := count(b, 1); n > 0 {
		max = bounded(n, d.lim.entries)
		// The entries in one allocation, and their pointers in another.
		es := make([]ratelimitv3.RateLimitDescriptor_Entry, max)
		desc.Entries = make([]*ratelimitv3.RateLimitDescriptor_Entry, 0, max)
		for i := range es {
			desc.Entries = append(desc.Entries, &es[i])
		}
		desc.Entries = desc.Entries[:0]
	}
	var unknown []byte
	for len(b) > 0 {
		num, typ, _, data, raw, rest, err := field(b)
		if err != nil {
			return err
		}
		b = rest
		switch {
		case num == 1 && typ == protowire.BytesType:
			if len(desc.Entries) == max {
				continue // past the limit: skipped
			}
			e := desc.Entries[:len(desc.Entries)+1][len(desc.Entries)]
			if err := d.entry(data, e); err != nil {
				return err
			}
			desc.Entries = desc.Entries[:len(desc.Entries)+1]
		case num == 2 && typ == protowire.BytesType:
			// A message field seen twice is merged, as protobuf does.
			if desc.Limit == nil {
				desc.Limit = new(ratelimitv3.RateLimitDescriptor_RateLimitOverride)
			}
			if err := unmarshalOverride(data, desc.Limit); err != nil {
				return err
			}
		case num == 3 && typ == protowire.BytesType:
			if desc.HitsAddend == nil {
				desc.HitsAddend = new(wrapperspb.UInt64Value)
			}
			if err := unmarshalUInt64Value(data, desc.HitsAddend); err != nil {
				return err
			}
		default:
			unknown = appendUnknown(unknown, num, typ, raw)
		}
	}
	setUnknown(desc, unknown)
	return nil
}

func (d *reqDecoder) entry(b []byte, e *ratelimitv3.RateLimitDescriptor_Entry) error {
	var unknown []byte
	for len(b) > 0 {
		num, typ, _, data, raw, rest, err := field(b)
		if err != nil {
			return err
		}
		b = rest
		switch {
		case num == 1 && typ == protowire.BytesType:
			if e.Key, err = d.str(data); err != nil {
				return err
			}
		case num == 2 && typ == protowire.BytesType:
			if e.Value, err = d.str(data); err != nil {
				return err
			}
		default:
			unknown = appendUnknown(unknown, num, typ, raw)
		}
	}
	setUnknown(e, unknown)
	return nil
}

func unmarshalOverride(b []byte, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) error {
	var unknown []byte
	for len(b) > 0 {
		num, typ, v, _, raw, rest, err := field(b)
		if err != nil {
			return err
		}
		b = rest
		switch {
		case num == 1 && typ == protowire.VarintType:
			o.RequestsPerUnit = uint32(v)
		case num == 2 && typ == protowire.VarintType:
			o.Unit = typev3.RateLimitUnit(int32(v))
		default:
			unknown = appendUnknown(unknown, num, typ, raw)
		}
	}
	mergeUnknown(o, unknown)
	return nil
}

func unmarshalUInt64Value(b []byte, w *wrapperspb.UInt64Value) error {
	var unknown []byte
	for len(b) > 0 {
		num, typ, v, _, raw, rest, err := field(b)
		if err != nil {
			return err
		}
		b = rest
		if num == 1 && typ == protowire.VarintType {
			w.Value = v
			continue
		}
		unknown = appendUnknown(unknown, num, typ, raw)
	}
	mergeUnknown(w, unknown)
	return nil
}
