//go:build wasip1

// Command guest is a tiny proxy-wasm 0.2.1 filter for the host's own tests.
// The request header x-test selects what it does; results come back as the
// response header x-result.
package main

import (
	"encoding/binary"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_log
func proxyLog(level uint32, msg unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(t, start, max uint32, ptr, size unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(m uint32, k unsafe.Pointer, kl uint32, ptr, size unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(m uint32, ptr, size unsafe.Pointer) uint32

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(m uint32, k unsafe.Pointer, kl uint32, v unsafe.Pointer, vl uint32) uint32

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(m uint32, k unsafe.Pointer, kl uint32, v unsafe.Pointer, vl uint32) uint32

//go:wasmimport env proxy_remove_header_map_value
func proxyRemoveHeaderMapValue(m uint32, k unsafe.Pointer, kl uint32) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(status uint32, d unsafe.Pointer, dl uint32, b unsafe.Pointer, bl uint32, h unsafe.Pointer, hl uint32, grpc int32) uint32

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(k unsafe.Pointer, kl uint32, ptr, size, cas unsafe.Pointer) uint32

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(k unsafe.Pointer, kl uint32, v unsafe.Pointer, vl uint32, cas uint32) uint32

//go:wasmimport env proxy_get_property
func proxyGetProperty(p unsafe.Pointer, pl uint32, ptr, size unsafe.Pointer) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(t uint32, n unsafe.Pointer, nl uint32, id unsafe.Pointer) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, offset int64) uint32

//go:wasmimport env proxy_record_metric
func proxyRecordMetric(id uint32, value uint64) uint32

//go:wasmimport env proxy_get_metric
func proxyGetMetric(id uint32, v unsafe.Pointer) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriod(ms uint32) uint32

//go:wasmimport env proxy_http_call
func proxyHTTPCall(up unsafe.Pointer, ulen uint32, hs unsafe.Pointer, hlen uint32, body unsafe.Pointer, blen uint32,
	tr unsafe.Pointer, tlen uint32, timeout uint32, id unsafe.Pointer) uint32

//go:wasmimport env proxy_grpc_call
func proxyGRPCCall(up unsafe.Pointer, ulen uint32, svc unsafe.Pointer, slen uint32, method unsafe.Pointer, mlen uint32,
	md unsafe.Pointer, mdlen uint32, msg unsafe.Pointer, msglen uint32, timeout uint32, id unsafe.Pointer) uint32

//go:wasmimport env proxy_grpc_cancel
func proxyGRPCCancel(id uint32) uint32

//go:wasmimport env proxy_get_status
func proxyGetStatus(code unsafe.Pointer, msg unsafe.Pointer, n unsafe.Pointer) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(id uint32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(t uint32) uint32

//go:wasmimport env proxy_register_shared_queue
func proxyRegisterSharedQueue(name unsafe.Pointer, n uint32, id unsafe.Pointer) uint32

// allocs keeps memory handed to the host alive until the next callback.
var allocs [][]byte

//go:wasmexport malloc
func malloc(size uint32) unsafe.Pointer {
	b := make([]byte, size)
	allocs = append(allocs, b)
	return unsafe.Pointer(&b[0])
}

//go:wasmexport proxy_on_memory_allocate
func onMemoryAllocate(size uint32) unsafe.Pointer { return malloc(size) }

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

func ptr(s string) unsafe.Pointer {
	if s == "" {
		return nil
	}
	return unsafe.Pointer(unsafe.StringData(s))
}

func bytesAt(p, n uint32) string {
	if n == 0 {
		return ""
	}
	return string(unsafe.Slice((*byte)(unsafe.Pointer(uintptr(p))), n))
}

func logf(level uint32, msg string) { proxyLog(level, ptr(msg), uint32(len(msg))) }

func buffer(t uint32) (string, uint32) {
	var p, n uint32
	st := proxyGetBufferBytes(t, 0, 1<<20, unsafe.Pointer(&p), unsafe.Pointer(&n))
	return bytesAt(p, n), st
}

func header(m uint32, k string) (string, uint32) {
	var p, n uint32
	st := proxyGetHeaderMapValue(m, ptr(k), uint32(len(k)), unsafe.Pointer(&p), unsafe.Pointer(&n))
	return bytesAt(p, n), st
}

func addHeader(m uint32, k, v string) uint32 {
	return proxyAddHeaderMapValue(m, ptr(k), uint32(len(k)), ptr(v), uint32(len(v)))
}

func property(path ...string) (string, uint32) {
	s := strings.Join(path, "\x00")
	var p, n uint32
	st := proxyGetProperty(ptr(s), uint32(len(s)), unsafe.Pointer(&p), unsafe.Pointer(&n))
	return bytesAt(p, n), st
}

func sharedGet(k string) (string, uint32, uint32) {
	var p, n, cas uint32
	st := proxyGetSharedData(ptr(k), uint32(len(k)), unsafe.Pointer(&p), unsafe.Pointer(&n), unsafe.Pointer(&cas))
	return bytesAt(p, n), cas, st
}

func sharedSet(k, v string, cas uint32) uint32 {
	return proxySetSharedData(ptr(k), uint32(len(k)), ptr(v), uint32(len(v)), cas)
}

func encodeHeaders(hs [][2]string) string {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(hs)))
	for _, h := range hs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(h[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(h[1])))
	}
	for _, h := range hs {
		b = append(append(b, h[0]...), 0)
		b = append(append(b, h[1]...), 0)
	}
	return string(b)
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

var (
	// calls maps a callout id to the context that waits for it; ticking
	// lists the contexts waiting for a tick; lastHeld is the last context
	// paused with "hold", dones counts proxy_on_done calls.
	calls    = map[uint32]uint32{}
	ticking  []uint32
	lastHeld uint32
	dones    int

	requests, logged, gauge, hist uint32
	bodyEOS                       uint32 // counter: body callbacks with end_of_stream
	pluginConfig                  string
	contexts                      = map[uint32]*httpContext{}
)

type httpContext struct {
	test   string
	result []string
}

func (c *httpContext) add(s ...string) { c.result = append(c.result, s...) }

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {
	allocs = nil
	if parent != 0 {
		contexts[id] = &httpContext{}
	}
}

//go:wasmexport proxy_on_vm_start
func onVMStart(root, size uint32) uint32 {
	allocs = nil
	cfg, _ := buffer(6)
	if cfg == "fail" {
		logf(4, "vm config says fail")
		return 0
	}
	return 1
}

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) uint32 {
	allocs = nil
	cfg, _ := buffer(7)
	pluginConfig = cfg
	if cfg == "fail" {
		logf(2, "about to fail")
		logf(4, "bad config: "+strconv.Quote(cfg))
		return 0
	}
	for _, m := range []struct {
		t    uint32
		name string
		id   *uint32
	}{{0, "test.requests", &requests}, {0, "test.logged", &logged}, {1, "test.gauge", &gauge}, {2, "test.hist", &hist}, {0, "test.body_eos", &bodyEOS}} {
		if st := proxyDefineMetric(m.t, ptr(m.name), uint32(len(m.name)), unsafe.Pointer(m.id)); st != 0 {
			logf(4, "define "+m.name+": "+itoa(st))
			return 0
		}
	}
	if cfg == "tick" {
		proxySetTickPeriod(1000)
	}
	return 1
}

//go:wasmexport proxy_on_tick
func onTick(root uint32) {
	allocs = nil
	proxyIncrementMetric(gauge, 1)
	if len(ticking) == 0 {
		return
	}
	for _, id := range ticking {
		if proxySetEffectiveContext(id) == 0 {
			contexts[id].add("ticked")
			proxyContinueStream(0)
		}
	}
	ticking = nil
	proxySetTickPeriod(0)
}

// resume makes the waiting context effective, records r and continues it.
func resume(callID uint32, r string) {
	id, ok := calls[callID]
	if !ok {
		return
	}
	delete(calls, callID)
	if st := proxySetEffectiveContext(id); st != 0 {
		return // the stream is gone: never continue another one
	}
	contexts[id].add(r)
	proxyContinueStream(0)
}

//go:wasmexport proxy_on_http_call_response
func onHTTPCallResponse(root, callID, nHeaders, bodySize, nTrailers uint32) {
	allocs = nil
	if nHeaders == 0 {
		resume(callID, "call=failed")
		return
	}
	status, _ := header(6, ":status")
	body, _ := buffer(4)
	trailer, _ := header(7, "x-trailer")
	resume(callID, "call="+status+"/"+body+"/"+trailer)
}

//go:wasmexport proxy_on_grpc_receive
func onGRPCReceive(root, callID, size uint32) {
	allocs = nil
	msg, _ := buffer(5)
	resume(callID, "grpc="+msg)
}

//go:wasmexport proxy_on_grpc_close
func onGRPCClose(root, callID, code uint32) {
	allocs = nil
	var c, p, n uint32
	proxyGetStatus(unsafe.Pointer(&c), unsafe.Pointer(&p), unsafe.Pointer(&n))
	resume(callID, "close="+itoa(code)+"/"+itoa(c)+"/"+bytesAt(p, n))
}

func httpCall(cluster string, timeout uint32) (uint32, uint32) {
	hs := encodeHeaders([][2]string{{":method", "POST"}, {":path", "/echo"}, {":authority", "up"}})
	body := "ping"
	var id uint32
	st := proxyHTTPCall(ptr(cluster), uint32(len(cluster)), ptr(hs), uint32(len(hs)), ptr(body), uint32(len(body)),
		nil, 0, timeout, unsafe.Pointer(&id))
	return id, st
}

func grpcCall(cluster string, timeout uint32) (uint32, uint32) {
	svc, method, msg := "test.Echo", "Say", "ping"
	var id uint32
	st := proxyGRPCCall(ptr(cluster), uint32(len(cluster)), ptr(svc), uint32(len(svc)), ptr(method), uint32(len(method)),
		nil, 0, ptr(msg), uint32(len(msg)), timeout, unsafe.Pointer(&id))
	return id, st
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	allocs = nil
	c := contexts[id]
	proxyIncrementMetric(requests, 1)
	c.test, _ = header(0, "X-Test")
	switch c.test {
	case "local":
		body := "slow down\n"
		hs := encodeHeaders([][2]string{{"X-Local", "yes"}, {"retry-after", "1"}})
		st := proxySendLocalResponse(429, ptr("limited"), 7, ptr(body), uint32(len(body)), ptr(hs), uint32(len(hs)), -1)
		c.add("send=" + itoa(st))
		return 1
	case "grpc":
		body := "too many\n"
		proxySendLocalResponse(429, nil, 0, ptr(body), uint32(len(body)), nil, 0, -1)
		return 1
	case "grpc-status":
		proxySendLocalResponse(429, nil, 0, nil, 0, nil, 0, 8)
		return 1
	case "pause":
		return 1
	case "http-call", "grpc-call", "grpc-slow", "grpc-cancel":
		cluster, _ := header(0, "x-cluster")
		var callID, st uint32
		if c.test == "http-call" {
			callID, st = httpCall(cluster, 1000)
		} else {
			timeout := uint32(1000)
			if c.test == "grpc-slow" {
				timeout = 50
			}
			callID, st = grpcCall(cluster, timeout)
		}
		if st != 0 {
			c.add("st=" + itoa(st))
			return 0
		}
		if c.test == "grpc-cancel" {
			c.add("cancel=" + itoa(proxyGRPCCancel(callID)) + "/" + itoa(proxyGRPCCancel(callID)))
			return 0
		}
		calls[callID] = id
		return 1
	case "tick-resume":
		ticking = append(ticking, id)
		proxySetTickPeriod(20)
		return 1
	case "hold":
		lastHeld = id
		return 1
	case "effective-gone":
		c.add("effective=" + itoa(proxySetEffectiveContext(lastHeld)))
		proxySetEffectiveContext(id)
		c.add("dones=" + itoa(uint32(dones)))
	case "continue-stray":
		// Two stray continues: with no stream effective (the root made
		// effective, as after a failed proxy_set_effective_context in a
		// root callback), and on a request already continued.
		c.add("none=" + itoa(proxySetEffectiveContext(1)) + "/" + itoa(proxyContinueStream(0)))
		proxySetEffectiveContext(id)
		c.add("first=" + itoa(proxyContinueStream(0)))
		c.add("again=" + itoa(proxyContinueStream(0)))
	case "unimplemented":
		name := "q"
		var qid uint32
		c.add("queue=" + itoa(proxyRegisterSharedQueue(ptr(name), 1, unsafe.Pointer(&qid))))
	case "badptr":
		var p, sz uint32
		c.add(itoa(proxyGetHeaderMapValue(0, unsafe.Pointer(uintptr(0xFFFFFFF0)), 64, unsafe.Pointer(&p), unsafe.Pointer(&sz))))
		k := "x-test"
		c.add(itoa(proxyGetHeaderMapValue(0, ptr(k), uint32(len(k)), unsafe.Pointer(uintptr(0xFFFFFFFF)), unsafe.Pointer(&sz))))
		path := "plugin_name"
		c.add(itoa(proxyGetProperty(ptr(path), uint32(len(path)), unsafe.Pointer(&p), unsafe.Pointer(uintptr(0xFFFFFFFE)))))
		c.add(itoa(proxyLog(2, unsafe.Pointer(uintptr(0xFFFFFF00)), 0x1000)))
		c.add(itoa(proxySetSharedData(ptr(k), uint32(len(k)), unsafe.Pointer(uintptr(0x7FFFFFF0)), 100, 0)))
	case "shared":
		attempts := 10
		if v, _ := header(0, "x-attempts"); v != "" {
			attempts, _ = strconv.Atoi(v)
		}
		for range attempts {
			v, cas, st := sharedGet("counter")
			if st != 0 && st != 1 {
				c.add("get=" + itoa(st))
				break
			}
			n, _ := strconv.Atoi(v)
			st = sharedSet("counter", strconv.Itoa(n+1), cas)
			if st == 0 {
				c.add("counter=" + strconv.Itoa(n+1))
				break
			}
			c.add("set=" + itoa(st))
		}
	case "props":
		for _, p := range [][]string{{"source", "address"}, {"source", "port"}, {"request", "path"}, {"request", "url_path"},
			{"request", "host"}, {"request", "method"}, {"request", "scheme"}, {"plugin_name"}, {"plugin_vm_id"}, {"plugin_root_id"},
			{"no", "such"}, {"source.address"}} {
			v, st := property(p...)
			if len(v) == 8 && p[1] == "port" {
				v = strconv.FormatUint(binary.LittleEndian.Uint64([]byte(v)), 10)
			}
			c.add(strings.Join(p, ".") + "=" + v + "/" + itoa(st))
		}
		id, st := property("request", "id")
		c.add("request.id=" + strconv.Itoa(len(id)) + "/" + itoa(st))
	case "pairs":
		var p, sz uint32
		st := proxyGetHeaderMapPairs(0, unsafe.Pointer(&p), unsafe.Pointer(&sz))
		b := []byte(bytesAt(p, sz))
		c.add(itoa(st), itoa(binary.LittleEndian.Uint32(b)))
	case "edit":
		addHeader(0, "X-Added", "1")
		v := "new"
		k := "x-replace"
		proxyReplaceHeaderMapValue(0, ptr(k), uint32(len(k)), ptr(v), uint32(len(v)))
		k = "x-remove"
		proxyRemoveHeaderMapValue(0, ptr(k), uint32(len(k)))
	case "time":
		c.add(strconv.FormatInt(time.Now().UnixNano(), 10))
	case "wrong-map":
		_, st := header(2, ":status")
		c.add(itoa(st))
	case "metrics":
		proxyRecordMetric(hist, 7)
		proxyRecordMetric(hist, 5)
		proxyIncrementMetric(gauge, 5)
		proxyIncrementMetric(gauge, -2)
		var v uint64
		c.add(itoa(proxyIncrementMetric(requests, -1)), itoa(proxyGetMetric(requests, unsafe.Pointer(&v))), strconv.FormatUint(v, 10),
			itoa(proxyGetMetric(hist, unsafe.Pointer(&v))), itoa(proxyIncrementMetric(99*4, 1)))
	case "config":
		c.add(pluginConfig)
		for _, r := range [][2]uint32{{2, 3}, {4, 100}, {100, 5}} {
			var p, n uint32
			st := proxyGetBufferBytes(7, r[0], r[1], unsafe.Pointer(&p), unsafe.Pointer(&n))
			c.add(bytesAt(p, n) + "/" + itoa(st) + "/" + itoa(p))
		}
		var p, n uint32
		c.add(itoa(proxyGetBufferBytes(0, 0, 10, unsafe.Pointer(&p), unsafe.Pointer(&n))))
		c.add(itoa(proxyGetBufferBytes(9, 0, 10, unsafe.Pointer(&p), unsafe.Pointer(&n))))
	case "delete":
		k := "doomed"
		sharedSet(k, "x", 0)
		_, cas, _ := sharedGet(k)
		c.add(itoa(proxySetSharedData(ptr(k), uint32(len(k)), nil, 0, cas)))
	case "sleep":
		time.Sleep(time.Millisecond)
	case "log-error":
		logf(4, "an error from the filter")
	}
	return 0
}

//go:wasmexport proxy_on_request_body
func onRequestBody(id, size, eos uint32) uint32 {
	allocs = nil
	c := contexts[id]
	body, st := buffer(0)
	c.add("body=" + body + "/" + itoa(st))
	_, st = header(0, "x-test")
	c.add("reqmap=" + itoa(st))
	return 0
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 {
	allocs = nil
	c := contexts[id]
	if c.test == "wrong-map" {
		_, st := header(0, "x-test")
		c.add(itoa(st))
	}
	status, _ := header(2, ":status")
	addHeader(2, "x-status-seen", status)
	addHeader(2, "x-eos", itoa(eos))
	if len(c.result) > 0 {
		addHeader(2, "x-result", strings.Join(c.result, ","))
	}
	return 0
}

//go:wasmexport proxy_on_response_body
func onResponseBody(id, size, eos uint32) uint32 {
	allocs = nil
	if eos != 0 {
		proxyIncrementMetric(bodyEOS, 1)
	}
	return 0
}

// onResponseTrailers reads the upstream's x-usage trailer and adds
// x-trailer-seen: "<value>/<num_trailers>/<status of the read>".
//
//go:wasmexport proxy_on_response_trailers
func onResponseTrailers(id, n uint32) uint32 {
	allocs = nil
	v, st := header(3, "x-usage")
	addHeader(3, "x-trailer-seen", v+"/"+itoa(n)+"/"+itoa(st))
	return 0
}

//go:wasmexport proxy_on_log
func onLog(id uint32) {
	allocs = nil
	proxyIncrementMetric(logged, 1)
	if c := contexts[id]; c != nil && c.test == "sleep-on-log" {
		// The Go runtime calls poll_oneoff, which traps unless the host
		// allows it: a VM that fails as the stream ends.
		time.Sleep(time.Millisecond)
	}
}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 { allocs = nil; dones++; return 1 }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {
	allocs = nil
	delete(contexts, id)
}
