package main

import (
	"errors"
	"fmt"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// The generator shares the machine with the services it measures, so its
// own CPU lowers both services' figures. grpc-go's proto codec would marshal
// the same request again on every call and unmarshal every response into a
// fresh RateLimitResponse: a third of the generator's CPU. Instead each
// request is marshalled once (with proto.Marshal, so the services get the
// very bytes they got before), and of the answer the generator reads
// overall_code after checking the whole message is well-formed protobuf.
// Everything else is grpc-go's client as before: the same HTTP/2 framing,
// headers (content-type application/grpc) and deadlines.

// shouldRateLimit is the RLS v3 method's full name.
var shouldRateLimit = rlspb.RateLimitService_ShouldRateLimit_FullMethodName

// encodedRequest is a RateLimitRequest already marshalled.
type encodedRequest struct{ b []byte }

// overallCode receives a RateLimitResponse's overall_code (field 1).
type overallCode int32

// codec is grpc-go's "proto" codec but for the two types above, which it
// passes through and reads itself. It replaces the registered codec of
// that name (the one grpc-go calls for application/grpc) in this program
// only.
type codec struct{ std encoding.CodecV2 }

func init() {
	encoding.RegisterCodecV2(codec{std: encoding.GetCodecV2(proto.Name)})
}

func (codec) Name() string { return proto.Name }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*encodedRequest); ok {
		// A SliceBuffer is never returned to a pool: the bytes stay ours.
		return mem.BufferSlice{mem.SliceBuffer(r.b)}, nil
	}
	return c.std.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	code, ok := v.(*overallCode)
	if !ok {
		return c.std.Unmarshal(data, v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	return parseOverallCode(b, code)
}

var errMalformed = errors.New("rlsload: malformed RateLimitResponse")

// parseOverallCode walks the top-level fields of a RateLimitResponse
// (each must be complete, of a valid wire type) and sets code to its
// overall_code (0, UNKNOWN, when absent, as protobuf reads it; the last
// one when repeated, as protobuf does).
func parseOverallCode(b []byte, code *overallCode) error {
	*code = 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errMalformed
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errMalformed
			}
			*code, b = overallCode(int32(v)), b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return fmt.Errorf("%w: field %d", errMalformed, num)
		}
		b = b[n:]
	}
	return nil
}
