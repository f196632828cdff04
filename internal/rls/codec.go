package rls

import (
	"errors"
	"fmt"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
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
// RateLimitRequest and encodes a RateLimitResponse by hand, with
// protowire and the field numbers of envoy/service/ratelimit/v3/rls.proto
// and envoy/extensions/common/ratelimit/v3/ratelimit.proto (as
// rlscontract does for the guest, in the other direction). Under load,
// protobuf's reflection-driven (un)marshalling was about an eighth of the
// service's CPU. The results are those of proto.Unmarshal and
// proto.Marshal (codec_test.go checks them against each other): every
// field Envoy sends, unknown fields kept, merges of repeated message
// fields, and proto3's UTF-8 check on strings. Any other message, and a
// response holding a field this encoder does not write, goes to the
// standard codec.
type Codec struct{ std encoding.CodecV2 }

// NewCodec returns the codec; grpc.ForceServerCodecV2 installs it.
func NewCodec() Codec { return Codec{std: encoding.GetCodecV2(protocodec.Name)} }

// Name is the standard codec's: the content-subtype is unchanged.
func (Codec) Name() string { return protocodec.Name }

// Marshal encodes v.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*rlsv3.RateLimitResponse); ok && canAppendResponse(r) {
		b := make([]byte, 0, responseSize(r))
		return mem.BufferSlice{mem.SliceBuffer(AppendResponse(b, r))}, nil
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
		return UnmarshalRequest(data[0].ReadOnlyData(), r)
	}
	return UnmarshalRequest(data.Materialize(), r)
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
	d := reqDecoder{buf: b}
	r.Domain, r.Descriptors, r.HitsAddend = "", nil, 0
	if n := count(b, 2); n > 0 {
		r.Descriptors = make([]*ratelimitv3.RateLimitDescriptor, 0, n)
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
	if n := count(b, 1); n > 0 {
		// The entries in one allocation, and their pointers in another.
		es := make([]ratelimitv3.RateLimitDescriptor_Entry, n)
		desc.Entries = make([]*ratelimitv3.RateLimitDescriptor_Entry, 0, n)
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

// canAppendResponse reports whether AppendResponse writes all of r: the
// fields the service sets, and no unknown fields. Strings that are not
// UTF-8 are left to proto.Marshal, which refuses them.
func canAppendResponse(r *rlsv3.RateLimitResponse) bool {
	if r == nil || len(r.RequestHeadersToAdd) > 0 || len(r.RawBody) > 0 || r.DynamicMetadata != nil || r.Quota != nil ||
		len(r.ProtoReflect().GetUnknown()) > 0 {
		return false
	}
	for _, s := range r.Statuses {
		if s == nil || len(s.ProtoReflect().GetUnknown()) > 0 ||
			s.CurrentLimit != nil && (len(s.CurrentLimit.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(s.CurrentLimit.Name)) ||
			s.DurationUntilReset != nil && len(s.DurationUntilReset.ProtoReflect().GetUnknown()) > 0 {
			return false
		}
		if q := s.Quota; q != nil {
			if len(q.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(q.Id) {
				return false
			}
			switch e := q.ExpirationSpecifier.(type) {
			case nil:
			case *rlsv3.RateLimitResponse_Quota_ValidUntil:
				if e.ValidUntil == nil || len(e.ValidUntil.ProtoReflect().GetUnknown()) > 0 {
					return false
				}
			default:
				return false
			}
		}
	}
	for _, h := range r.ResponseHeadersToAdd {
		if h == nil || len(h.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
			return false
		}
	}
	return true
}

// The sizes below are those of the encodings AppendResponse writes.

func sizeBytes(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func sizeVarint(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func sizeString(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return sizeBytes(num, len(s))
}

func secondsNanosSize(sec int64, nanos int32) int {
	return sizeVarint(1, uint64(sec)) + sizeVarint(2, uint64(int64(nanos)))
}

func rateLimitSize(l *rlsv3.RateLimitResponse_RateLimit) int {
	return sizeVarint(1, uint64(l.RequestsPerUnit)) + sizeVarint(2, uint64(int64(l.Unit))) + sizeString(3, l.Name)
}

func quotaSize(q *rlsv3.RateLimitResponse_Quota) int {
	n := sizeVarint(1, uint64(q.Requests)) + sizeString(3, q.Id)
	if e, ok := q.ExpirationSpecifier.(*rlsv3.RateLimitResponse_Quota_ValidUntil); ok {
		n += sizeBytes(2, secondsNanosSize(e.ValidUntil.Seconds, e.ValidUntil.Nanos))
	}
	return n
}

func statusSize(s *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := sizeVarint(1, uint64(int64(s.Code))) + sizeVarint(3, uint64(s.LimitRemaining))
	if s.CurrentLimit != nil {
		n += sizeBytes(2, rateLimitSize(s.CurrentLimit))
	}
	if d := s.DurationUntilReset; d != nil {
		n += sizeBytes(4, secondsNanosSize(d.Seconds, d.Nanos))
	}
	if s.Quota != nil {
		n += sizeBytes(5, quotaSize(s.Quota))
	}
	return n
}

func headerSize(h *corev3.HeaderValue) int {
	n := sizeString(1, h.Key) + sizeString(2, h.Value)
	if len(h.RawValue) > 0 {
		n += sizeBytes(3, len(h.RawValue))
	}
	return n
}

func responseSize(r *rlsv3.RateLimitResponse) int {
	n := sizeVarint(1, uint64(int64(r.OverallCode)))
	for _, s := range r.Statuses {
		n += sizeBytes(2, statusSize(s))
	}
	for _, h := range r.ResponseHeadersToAdd {
		n += sizeBytes(3, headerSize(h))
	}
	return n
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func appendLen(b []byte, num protowire.Number, n int) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.BytesType), uint64(n))
}

func appendSecondsNanos(b []byte, num protowire.Number, sec int64, nanos int32) []byte {
	b = appendLen(b, num, secondsNanosSize(sec, nanos))
	b = appendVarintField(b, 1, uint64(sec))
	return appendVarintField(b, 2, uint64(int64(nanos)))
}

// AppendResponse appends r as proto.Marshal encodes it, provided
// canAppendResponse(r): fields in number order (a oneof last), proto3
// defaults left out,
// negative enums and int32s as ten-byte varints.
func AppendResponse(b []byte, r *rlsv3.RateLimitResponse) []byte {
	b = appendVarintField(b, 1, uint64(int64(r.OverallCode)))
	for _, s := range r.Statuses {
		b = appendLen(b, 2, statusSize(s))
		b = appendVarintField(b, 1, uint64(int64(s.Code)))
		if l := s.CurrentLimit; l != nil {
			b = appendLen(b, 2, rateLimitSize(l))
			b = appendVarintField(b, 1, uint64(l.RequestsPerUnit))
			b = appendVarintField(b, 2, uint64(int64(l.Unit)))
			b = appendStringField(b, 3, l.Name)
		}
		b = appendVarintField(b, 3, uint64(s.LimitRemaining))
		if d := s.DurationUntilReset; d != nil {
			b = appendSecondsNanos(b, 4, d.Seconds, d.Nanos)
		}
		if q := s.Quota; q != nil {
			b = appendLen(b, 5, quotaSize(q))
			b = appendVarintField(b, 1, uint64(q.Requests))
			b = appendStringField(b, 3, q.Id)
			// proto.Marshal writes a oneof after the other fields.
			if e, ok := q.ExpirationSpecifier.(*rlsv3.RateLimitResponse_Quota_ValidUntil); ok {
				b = appendSecondsNanos(b, 2, e.ValidUntil.Seconds, e.ValidUntil.Nanos)
			}
		}
	}
	for _, h := range r.ResponseHeadersToAdd {
		b = appendLen(b, 3, headerSize(h))
		b = appendStringField(b, 1, h.Key)
		b = appendStringField(b, 2, h.Value)
		if len(h.RawValue) > 0 {
			b = protowire.AppendBytes(protowire.AppendTag(b, 3, protowire.BytesType), h.RawValue)
		}
	}
	return b
}
