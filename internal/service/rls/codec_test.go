package rls

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// randString is mostly what Envoy sends (ASCII), sometimes empty or other
// UTF-8.
func randString(r *rand.Rand) string {
	switch r.IntN(8) {
	case 0:
		return ""
	case 1:
		return "é→😀" + string(rune('a'+r.IntN(26)))
	}
	b := make([]byte, r.IntN(40))
	for i := range b {
		b[i] = byte(' ' + r.IntN(95))
	}
	return string(b)
}

// randUint is small, or any size (up to the varint's ten bytes).
func randUint(r *rand.Rand) uint64 {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return uint64(r.IntN(200))
	case 2:
		return uint64(r.Uint32())
	}
	return r.Uint64()
}

// unknownField is a field no message here has (numbers 50-99), of any
// wire type, groups included.
func unknownField(r *rand.Rand) []byte {
	num := protowire.Number(50 + r.IntN(50))
	switch r.IntN(5) {
	case 0:
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), randUint(r))
	case 1:
		return protowire.AppendFixed32(protowire.AppendTag(nil, num, protowire.Fixed32Type), r.Uint32())
	case 2:
		return protowire.AppendFixed64(protowire.AppendTag(nil, num, protowire.Fixed64Type), r.Uint64())
	case 3:
		b := protowire.AppendTag(nil, num, protowire.StartGroupType)
		b = protowire.AppendVarint(protowire.AppendTag(b, 1, protowire.VarintType), 7)
		return protowire.AppendTag(b, num, protowire.EndGroupType)
	}
	return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), randString(r))
}

func randRequest(r *rand.Rand) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: randString(r), HitsAddend: uint32(randUint(r))}
	for range r.IntN(4) {
		d := &ratelimitv3.RateLimitDescriptor{}
		for range r.IntN(5) {
			e := &ratelimitv3.RateLimitDescriptor_Entry{Key: randString(r), Value: randString(r)}
			if r.IntN(6) == 0 {
				e.ProtoReflect().SetUnknown(unknownField(r))
			}
			d.Entries = append(d.Entries, e)
		}
		if r.IntN(3) == 0 {
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(randUint(r)),
				Unit: typev3.RateLimitUnit(r.IntN(8) - 1)}
			if r.IntN(6) == 0 {
				d.Limit.ProtoReflect().SetUnknown(unknownField(r))
			}
		}
		if r.IntN(3) == 0 {
			d.HitsAddend = wrapperspb.UInt64(randUint(r))
			if r.IntN(6) == 0 {
				d.HitsAddend.ProtoReflect().SetUnknown(unknownField(r))
			}
		}
		if r.IntN(6) == 0 {
			d.ProtoReflect().SetUnknown(unknownField(r))
		}
		if r.IntN(8) == 0 {
			d = nil // marshalled as an empty descriptor
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	if r.IntN(6) == 0 {
		req.ProtoReflect().SetUnknown(unknownField(r))
	}
	return req
}

// checkRequest decodes b with UnmarshalRequest and proto.Unmarshal and
// wants the same verdict and, when both decode, equal messages.
func checkRequest(t *testing.T, b []byte) {
	t.Helper()
	var want, got rlsv3.RateLimitRequest
	werr := proto.Unmarshal(b, &want)
	gerr := UnmarshalRequest(b, &got)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("%x: proto.Unmarshal: %v, UnmarshalRequest: %v", b, werr, gerr)
	}
	if werr == nil && !proto.Equal(&want, &got) {
		t.Fatalf("%x:\nproto.Unmarshal  %v\nUnmarshalRequest %v", b, &want, &got)
	}
}

// TestUnmarshalRequest decodes thousands of random requests, unknown fields
// at every level included, as proto.Unmarshal does; then the same bytes
// with fields repeated (merged or appended), cut short, or corrupted.
func TestUnmarshalRequest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		req := randRequest(r)
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		checkRequest(t, b)
		var got rlsv3.RateLimitRequest
		if err := UnmarshalRequest(b, &got); err != nil || !proto.Equal(req, &got) && !hasNilDescriptor(req) {
			t.Fatalf("%v: got %v, %v", req, &got, err)
		}
		// Concatenation is a merge: scalars take the last value, repeated
		// fields append.
		checkRequest(t, append(append([]byte(nil), b...), b...))
		if len(b) > 0 {
			checkRequest(t, b[:r.IntN(len(b))])
			c := append([]byte(nil), b...)
			c[r.IntN(len(c))] ^= byte(1 + r.IntN(255))
			checkRequest(t, c)
		}
	}
}

func hasNilDescriptor(req *rlsv3.RateLimitRequest) bool {
	for _, d := range req.Descriptors {
		if d == nil {
			return true
		}
	}
	return false
}

// TestUnmarshalRequestEdges: what Envoy's filter and ours send, field by
// field, and the cases protobuf decides in particular ways.
func TestUnmarshalRequestEdges(t *testing.T) {
	tag := func(num protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(nil, num, typ) }
	str := func(num protowire.Number, s string) []byte {
		return protowire.AppendString(tag(num, protowire.BytesType), s)
	}
	msg := func(num protowire.Number, parts ...[]byte) []byte {
		return protowire.AppendBytes(tag(num, protowire.BytesType), bytes.Join(parts, nil))
	}
	vint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(tag(num, protowire.VarintType), v)
	}
	entry := func(k, v string) []byte { return msg(1, str(1, k), str(2, v)) }
	for name, b := range map[string][]byte{
		"ours":            bytes.Join([][]byte{str(1, "tokengate"), msg(2, entry("tokengate_rule", "per-ip"), entry("key", "192.0.2.1"), msg(3, vint(1, 5))), vint(3, 1)}, nil),
		"envoy override":  bytes.Join([][]byte{str(1, "edge"), msg(2, entry("remote_address", "::1"), msg(2, vint(1, 10), vint(2, 2)))}, nil),
		"merged override": msg(2, msg(2, vint(1, 10)), msg(2, vint(2, 3)), msg(3, vint(1, 4)), msg(3)),
		"hits 2^32+1":     vint(3, 1<<32+1),
		"negative unit":   msg(2, msg(2, vint(2, math.MaxUint64))),
		"domain varint":   vint(1, 3), // a known number of another wire type: unknown
		"bad utf8 domain": str(1, "\xff"),
		"bad utf8 key":    msg(2, entry("\xc3", "v")),
		"bad utf8 value":  msg(2, entry("k", "\xed\xa0\x80")),
		"utf8 in unknown": str(60, "\xff"),
		"field 0":         vint(0, 1),
		"max field":       vint(protowire.MaxValidNumber, 1),
		"over max field":  protowire.AppendVarint(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3), 1),
		"end group":       tag(5, protowire.EndGroupType),
		"open group":      tag(5, protowire.StartGroupType),
		"group":           append(append(tag(5, protowire.StartGroupType), vint(1, 2)...), tag(5, protowire.EndGroupType)...),
		"wire type 6":     {0x0e},
		"long varint":     {0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02},
		"length past end": {0x0a, 0x05, 'a'},
		"empty":           nil,
	} {
		t.Run(name, func(t *testing.T) { checkRequest(t, b) })
	}
}

// FuzzUnmarshalRequest: on any bytes, UnmarshalRequest agrees with
// proto.Unmarshal. `go test` runs the seeds; `go test -fuzz` explores.
func FuzzUnmarshalRequest(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		b, err := proto.Marshal(randRequest(r))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkRequest(t, b) })
}

func randResponse(r *rand.Rand) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(r.IntN(4) - 1)}
	for range r.IntN(4) {
		s := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(r.IntN(3)),
			LimitRemaining: uint32(randUint(r))}
		if r.IntN(4) > 0 {
			s.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: randString(r), RequestsPerUnit: uint32(randUint(r)),
				Unit: rlsv3.RateLimitResponse_RateLimit_Unit(r.IntN(8) - 1)}
		}
		if r.IntN(4) > 0 {
			s.DurationUntilReset = &durationpb.Duration{Seconds: int64(randUint(r)), Nanos: int32(r.IntN(2e9) - 1e9)}
		}
		if r.IntN(3) == 0 {
			s.Quota = &rlsv3.RateLimitResponse_Quota{Requests: uint32(randUint(r)), Id: randString(r)}
			if r.IntN(3) > 0 {
				s.Quota.ExpirationSpecifier = &rlsv3.RateLimitResponse_Quota_ValidUntil{
					ValidUntil: &timestamppb.Timestamp{Seconds: int64(randUint(r)), Nanos: int32(r.IntN(1e9))}}
			}
		}
		resp.Statuses = append(resp.Statuses, s)
	}
	for range r.IntN(6) {
		h := &corev3.HeaderValue{Key: randString(r), Value: randString(r)}
		if r.IntN(5) == 0 {
			h.RawValue = []byte(randString(r))
		}
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, h)
	}
	return resp
}

// marshal is what the codec sends.
func marshal(t *testing.T, m any) []byte {
	t.Helper()
	data, err := NewCodec().Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return data.Materialize()
}

// TestMarshalResponse: for thousands of responses of every field the
// service sets, what the codec sends decodes to the response, and is
// proto.Marshal's encoding up to the order of fields (vtprotobuf writes a
// oneof in field order, proto.Marshal last). Without the vtprotobuf tag the
// codec is proto.Marshal itself; the Makefile's builds have the tag, and
// TestVTMarshalUsed (codec_vt_test.go) checks that the codec then uses it.
func TestMarshalResponse(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 3000 {
		resp := randResponse(r)
		want, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		got := marshal(t, resp)
		var back rlsv3.RateLimitResponse
		if err := proto.Unmarshal(got, &back); err != nil || !proto.Equal(&back, resp) {
			t.Fatalf("%v: codec wrote %x, which decodes to %v (%v)", resp, got, &back, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%v: codec wrote %d bytes, proto.Marshal %d", resp, len(got), len(want))
		}
	}
}

// TestMarshalEveryField: a response with the fields the service never
// sets, unknown fields included, and other messages, arrive whole.
func TestMarshalEveryField(t *testing.T) {
	withUnknown := func(m proto.Message) {
		m.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 90, protowire.VarintType), 1))
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "r"}, DurationUntilReset: durationpb.New(0),
			Quota: &rlsv3.RateLimitResponse_Quota{Id: "1"}}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "k", Value: "v"}},
		RequestHeadersToAdd:  []*corev3.HeaderValue{{Key: "a"}},
		RawBody:              []byte("x"),
		DynamicMetadata:      &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStringValue("b")}},
		Quota:                &rlsv3.RateLimitResponse_Quota{Requests: 1}}
	withUnknown(resp)
	withUnknown(resp.Statuses[0])
	withUnknown(resp.Statuses[0].CurrentLimit)
	withUnknown(resp.ResponseHeadersToAdd[0])
	var back rlsv3.RateLimitResponse
	if got := marshal(t, resp); proto.Unmarshal(got, &back) != nil || !proto.Equal(&back, resp) {
		t.Fatalf("codec wrote %x, which decodes to %v", got, &back)
	}
	// Another message type: the standard codec.
	d := durationpb.New(1500 * 1e6)
	want, _ := proto.Marshal(d)
	if got := marshal(t, d); !bytes.Equal(got, want) {
		t.Errorf("Duration: %x, want %x", got, want)
	}
	var dback durationpb.Duration
	if err := NewCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(want)}, &dback); err != nil || !proto.Equal(&dback, d) {
		t.Errorf("Duration back: %v %v", &dback, err)
	}
}

// TestCodecUnmarshalSplit: a request arriving in several buffers decodes
// as one.
func TestCodecUnmarshalSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	req := randRequest(r)
	for len(req.Descriptors) == 0 {
		req = randRequest(r)
	}
	b, _ := proto.Marshal(req)
	for cut := range len(b) + 1 {
		var got rlsv3.RateLimitRequest
		data := mem.BufferSlice{mem.SliceBuffer(b[:cut]), mem.SliceBuffer(b[cut:])}
		if err := NewCodec().Unmarshal(data, &got); err != nil || !proto.Equal(&got, req) && !hasNilDescriptor(req) {
			t.Fatalf("cut at %d: %v %v", cut, &got, err)
		}
	}
}

// BenchmarkCodec compares the codec (hand-written decoder, vtprotobuf
// encoder under the vtprotobuf tag) with grpc-go's on what
// the filter sends and the service answers.
func BenchmarkCodec(b *testing.B) {
	req := &rlsv3.RateLimitRequest{Domain: "tokengate", HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tokengate_rule", Value: "per-ip"}, {Key: "key", Value: "192.0.2.1"}}}}}
	reqBytes, _ := proto.Marshal(req)
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
		Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "per-ip", RequestsPerUnit: 100, Unit: 1},
		LimitRemaining: 99, DurationUntilReset: durationpb.New(1e7)}}}
	for _, c := range []struct {
		name  string
		codec interface {
			Marshal(any) (mem.BufferSlice, error)
			Unmarshal(mem.BufferSlice, any) error
		}
	}{{"ours", NewCodec()}, {"std", NewCodec().std}} {
		b.Run(c.name+"/unmarshal", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var r rlsv3.RateLimitRequest
				if err := c.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(reqBytes)}, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/marshal", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.codec.Marshal(resp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
