//go:build cgo

// Command tokengate-dynmod is tokengate as an Envoy dynamic module: built
// with -buildmode=c-shared into libtokengate.so (make dynmod), it exports
// the hooks of Envoy's dynamic-module ABI "v0.1.0" (Envoy 1.38; 1.39 and
// 1.40 load it too) and runs the same filter, with the same JSON
// configuration, as the proxy-wasm module. The hooks are C functions
// (hooks.c) that call the Go side here when a stream needs it; the
// callbacks are reached through the C wrappers of wrappers.c; everything
// else is filter/dynmod. Every wrapper is
// noescape (C keeps no Go pointer past a call, and a Go argument frame
// that escaped would cost an allocation per call); those that cannot call
// back into the module (Envoy may re-enter hooks from send_response,
// continue_decoding, callouts and scheduler_new/delete) are nocallback. See
// docs/deploy/dynamic-module.md.
package main

/*
#cgo CFLAGS: -O2
#cgo linux LDFLAGS: -Wl,--unresolved-symbols=ignore-all
#cgo darwin LDFLAGS: -Wl,-undefined,dynamic_lookup
#cgo noescape tg_get_header
#cgo noescape tg_set_header
#cgo noescape tg_set_headers
#cgo noescape tg_log
#cgo noescape tg_hdr_add
#cgo noescape tg_hdr_reset
#cgo noescape tg_worker_index
#cgo noescape tg_concurrency
#cgo noescape tg_define_counter
#cgo noescape tg_increment_counter
#cgo noescape tg_source_address
#cgo noescape tg_continue_decoding
#cgo noescape tg_send_response
#cgo noescape tg_callout
#cgo noescape tg_scheduler_new
#cgo noescape tg_scheduler_commit
#cgo noescape tg_scheduler_delete
#cgo nocallback tg_get_header
#cgo nocallback tg_set_header
#cgo nocallback tg_set_headers
#cgo nocallback tg_log
#cgo nocallback tg_hdr_add
#cgo nocallback tg_hdr_reset
#cgo nocallback tg_worker_index
#cgo nocallback tg_increment_counter
#cgo nocallback tg_source_address
#cgo nocallback tg_scheduler_commit
#include "abi.h"
*/
import "C"

import (
	"runtime/metrics"
	"unsafe"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/dynmod"
)

func main() {}

func init() { dynmod.Bind(cenv{}) }

// cenv implements dynmod.Envoy over the C wrappers (wrappers.c).
type cenv struct{}

// cstr returns the pointer and length of s for C: Go memory without Go
// pointers, read by C during the call only.
func cstr(s string) (*C.char, C.size_t) {
	return (*C.char)(unsafe.Pointer(unsafe.StringData(s))), C.size_t(len(s))
}

func cbytes(b []byte) (*C.char, C.size_t) {
	return (*C.char)(unsafe.Pointer(unsafe.SliceData(b))), C.size_t(len(b))
}

// gostr views C memory as a string, valid while Envoy keeps it.
func gostr(p *C.char, n C.size_t) string {
	if p == nil || n == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Pointer(p)), int(n))
}

func (cenv) Concurrency() uint32 { return uint32(C.tg_concurrency()) }

func (cenv) WorkerIndex(f uintptr) uint32 { return uint32(C.tg_worker_index(C.uintptr_t(f))) }

func (cenv) Log(level filter.LogLevel, msg string) {
	p, n := cstr(msg)
	C.tg_log(C.uint32_t(level), p, n)
}

func (cenv) DefineCounter(cfg uintptr, name string) (uint64, bool) {
	p, n := cstr(name)
	r := C.tg_define_counter(C.uintptr_t(cfg), p, n)
	return uint64(r.id), r.status == 0
}

func (cenv) IncrementCounter(f uintptr, id, delta uint64) {
	C.tg_increment_counter(C.uintptr_t(f), C.uint64_t(id), C.uint64_t(delta))
}

func (cenv) Header(f uintptr, kind dynmod.HeaderKind, name string, index int) (string, int, bool) {
	p, n := cstr(name)
	r := C.tg_get_header(C.uintptr_t(f), C.uint32_t(kind), p, n, C.size_t(index))
	if r.ok == 0 {
		return "", int(r.count), false
	}
	return gostr(r.ptr, r.len), int(r.count), true
}

func (cenv) SetHeader(f uintptr, kind dynmod.HeaderKind, name, value string) {
	kp, kn := cstr(name)
	vp, vn := cstr(value)
	C.tg_set_header(C.uintptr_t(f), C.uint32_t(kind), kp, kn, vp, vn, 0)
}

func (cenv) SetHeaders(f uintptr, kind dynmod.HeaderKind, buf []byte, ops []uint32) {
	bp, _ := cbytes(buf)
	C.tg_set_headers(C.uintptr_t(f), C.uint32_t(kind), bp, (*C.uint32_t)(unsafe.Pointer(unsafe.SliceData(ops))), C.size_t(len(ops)/3))
}

func (cenv) AddHeader(f uintptr, kind dynmod.HeaderKind, name, value string) {
	kp, kn := cstr(name)
	vp, vn := cstr(value)
	C.tg_set_header(C.uintptr_t(f), C.uint32_t(kind), kp, kn, vp, vn, 1)
}

// headers copies hs into this thread's C header buffer.
func headers(hs [][2]string) {
	C.tg_hdr_reset()
	for _, h := range hs {
		kp, kn := cstr(h[0])
		vp, vn := cstr(h[1])
		C.tg_hdr_add(kp, kn, vp, vn)
	}
}

func (cenv) SendResponse(f uintptr, status uint32, hs [][2]string, body []byte, details string) {
	headers(hs)
	bp, bn := cbytes(body)
	dp, dn := cstr(details)
	C.tg_send_response(C.uintptr_t(f), C.uint32_t(status), bp, bn, dp, dn)
}

func (cenv) ContinueDecoding(f uintptr) { C.tg_continue_decoding(C.uintptr_t(f)) }

func (cenv) SourceAddress(f uintptr) (string, bool) {
	r := C.tg_source_address(C.uintptr_t(f))
	if r.ok == 0 {
		return "", false
	}
	return gostr(r.ptr, r.len), true
}

func (cenv) Callout(f uintptr, cluster string, hs [][2]string, body []byte, timeoutMs uint64) (uint64, bool) {
	headers(hs)
	cp, cn := cstr(cluster)
	bp, bn := cbytes(body)
	r := C.tg_callout(C.uintptr_t(f), cp, cn, bp, bn, C.uint64_t(timeoutMs))
	return uint64(r.id), r.status == 0
}

func (cenv) SchedulerNew(f uintptr) uintptr { return uintptr(C.tg_scheduler_new(C.uintptr_t(f))) }

func (cenv) SchedulerCommit(s uintptr, event uint64) {
	C.tg_scheduler_commit(C.uintptr_t(s), C.uint64_t(event))
}

func (cenv) SchedulerDelete(s uintptr) { C.tg_scheduler_delete(C.uintptr_t(s)) }

// recovered is the exports' own barrier, for a panic in this file: the
// dynmod hooks recover their own.
func recovered() { _ = recover() }

// The Go side of the hooks, called by hooks.c, which exports Envoy's hook
// symbols, keeps a C record per stream (so that Envoy holds no Go
// pointer), and crosses into Go only when the stream needs it.

//export tgo_config_new
func tgo_config_new(cfg C.uintptr_t, config *C.char, n C.size_t) (h C.uintptr_t) {
	defer recovered()
	var raw []byte
	if config != nil && n > 0 {
		raw = unsafe.Slice((*byte)(unsafe.Pointer(config)), int(n))
	}
	return C.uintptr_t(dynmod.ConfigNew(uintptr(cfg), raw)) // ConfigNew copies raw
}

//export tgo_config_destroy
func tgo_config_destroy(h C.uintptr_t) {
	defer recovered()
	dynmod.ConfigDestroy(uintptr(h))
}

// The mailbox has the same layout on both sides: a size that differs fails
// the build.
var _ = [1]struct{}{}[unsafe.Sizeof(dynmod.Mailbox{})-unsafe.Sizeof(C.tg_mailbox{})]

// tgo_request_headers_new is the crossing of almost every request, and
// defers no recover of its own: dynmod.RequestHeadersNewAt guards all it
// runs (one guard per crossing), and nothing before it can panic but a
// view of a source address longer than any (unsafe.String's length out of
// range), answered here as the recover did: no Go side, continue.
//
//export tgo_request_headers_new
func tgo_request_headers_new(cfg, f C.uintptr_t, worker C.uint32_t, end C.bool,
	src *C.char, srcLen C.size_t, srcOK C.bool, box *C.tg_mailbox, now C.int64_t) (h C.uintptr_t, st C.uint32_t) {
	if srcLen > 1<<30 {
		return 0, 0
	}
	gh, gst := dynmod.RequestHeadersNewAt(uintptr(cfg), uintptr(f), uint32(worker), bool(end),
		gostr(src, srcLen), bool(srcOK), (*dynmod.Mailbox)(unsafe.Pointer(box)), int64(now))
	return C.uintptr_t(gh), C.uint32_t(gst)
}

//export tgo_request_headers
func tgo_request_headers(f, h C.uintptr_t, end C.bool) (st C.uint32_t) {
	defer recovered()
	return C.uint32_t(dynmod.RequestHeaders(uintptr(f), uintptr(h), bool(end)))
}

//export tgo_request_body
func tgo_request_body(f, h C.uintptr_t, end C.bool) (st C.uint32_t) {
	defer recovered()
	return C.uint32_t(dynmod.RequestBody(uintptr(f), uintptr(h), bool(end)))
}

//export tgo_request_trailers
func tgo_request_trailers(f, h C.uintptr_t) (st C.uint32_t) {
	defer recovered()
	return C.uint32_t(dynmod.RequestTrailers(uintptr(f), uintptr(h)))
}

//export tgo_response_headers
func tgo_response_headers(f, h C.uintptr_t, end C.bool) (st C.uint32_t) {
	defer recovered()
	return C.uint32_t(dynmod.ResponseHeaders(uintptr(f), uintptr(h), bool(end)))
}

//export tgo_response_body
func tgo_response_body(f, h C.uintptr_t, end C.bool) (st C.uint32_t) {
	defer recovered()
	return C.uint32_t(dynmod.ResponseBody(uintptr(f), uintptr(h), bool(end)))
}

//export tgo_response_trailers
func tgo_response_trailers(f, h C.uintptr_t) (st C.uint32_t) {
	defer recovered()
	return C.uint32_t(dynmod.ResponseTrailers(uintptr(f), uintptr(h)))
}

//export tgo_stream_complete
func tgo_stream_complete(f, h C.uintptr_t) (released C.int) {
	defer recovered()
	if dynmod.StreamComplete(uintptr(f), uintptr(h)) {
		return 1
	}
	return 0
}

//export tgo_destroy
func tgo_destroy(h C.uintptr_t) {
	defer recovered()
	dynmod.Destroy(uintptr(h))
}

//export tgo_callout_done
func tgo_callout_done(f, h C.uintptr_t, id C.uint64_t, result C.uint32_t,
	hs *C.tg_header, nh C.size_t, chunks *C.tg_buffer, nc C.size_t) {
	defer recovered()
	resp := &dynmod.CallResponse{}
	if hs != nil && nh > 0 {
		for _, x := range unsafe.Slice(hs, int(nh)) {
			resp.Headers = append(resp.Headers, [2]string{gostr(x.key_ptr, x.key_length), gostr(x.value_ptr, x.value_length)})
		}
	}
	if chunks != nil && nc > 0 {
		for _, b := range unsafe.Slice(chunks, int(nc)) {
			if b.ptr != nil && b.length > 0 {
				resp.Body = append(resp.Body, unsafe.Slice((*byte)(unsafe.Pointer(b.ptr)), int(b.length)))
			}
		}
	}
	dynmod.CalloutDone(uintptr(f), uintptr(h), uint64(id), uint32(result), resp)
}

//export tgo_scheduled
func tgo_scheduled(f, h C.uintptr_t, event C.uint64_t) {
	defer recovered()
	dynmod.Scheduled(uintptr(f), uintptr(h), uint64(event))
}

// allocSample reads the Go heap's allocation count without allocating.
var allocSample = []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}

// tokengate_dynmod_go_allocs returns the number of Go heap objects the
// module has allocated since it was loaded: not an Envoy hook, but what the
// test host reads to check that a request allocates nothing.
//
//export tokengate_dynmod_go_allocs
func tokengate_dynmod_go_allocs() C.uint64_t {
	metrics.Read(allocSample)
	return C.uint64_t(allocSample[0].Value.Uint64())
}
