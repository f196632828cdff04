//go:build wasip1

package abi

import (
	"errors"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/sharedstate"
)

// host implements filter.Host over the imports. Calls act on the context
// the host is currently calling into.
type host struct{}

var _ filter.Host = host{}

// statusError is a Status other than OK, NOT_FOUND or CAS_MISMATCH.
type statusError uint32

func (s statusError) Error() string {
	return "proxy-wasm status " + strconv.FormatUint(uint64(s), 10)
}

var errBadReturn = errors.New("proxy-wasm: host returned memory it did not allocate")

func (host) Log(level filter.LogLevel, msg string) {
	proxyLog(uint32(level), ptr(msg), uint32(len(msg)))
}

func (host) Get(key string) ([]byte, uint32, error) {
	unpin()
	defer unpin()
	var data, size, cas uint32
	switch st := proxyGetSharedData(ptr(key), uint32(len(key)), &data, &size, &cas); st {
	case statusOK:
	case statusNotFound:
		return nil, 0, sharedstate.ErrNotFound
	default:
		return nil, 0, statusError(st)
	}
	b, ok := returned(data, size)
	if !ok {
		return nil, 0, errBadReturn
	}
	return b, cas, nil
}

func (host) Set(key string, value []byte, cas uint32) error {
	switch st := proxySetSharedData(ptr(key), uint32(len(key)), bptr(value), uint32(len(value)), cas); st {
	case statusOK:
		return nil
	case statusCASMismatch:
		return sharedstate.ErrCASMismatch
	case statusNotFound:
		// ngx_wasm_module may answer a stale cas on a vanished key this way.
		return sharedstate.ErrCASMismatch
	default:
		return statusError(st)
	}
}

func (host) DefineCounter(name string) (uint32, error) {
	var id uint32
	if st := proxyDefineMetric(metricCounter, ptr(name), uint32(len(name)), &id); st != statusOK {
		return 0, statusError(st)
	}
	return id, nil
}

func (host) IncrementCounter(id uint32, delta int64) {
	proxyIncrementMetric(id, delta)
}

func (host) RequestHeader(name string) (string, bool) {
	unpin()
	defer unpin()
	var data, size uint32
	if proxyGetHeaderMapValue(mapRequestHeaders, ptr(name), uint32(len(name)), &data, &size) != statusOK {
		return "", false
	}
	b, ok := returned(data, size)
	if !ok {
		return "", false
	}
	return string(b), true
}

func (host) Property(path ...string) ([]byte, bool) {
	unpin()
	defer unpin()
	p := strings.Join(path, "\x00")
	var data, size uint32
	if proxyGetProperty(ptr(p), uint32(len(p)), &data, &size) != statusOK {
		return nil, false
	}
	return returned(data, size)
}

func (host) SetResponseHeader(name, value string) {
	proxyReplaceHeaderMapValue(mapResponseHeaders, ptr(name), uint32(len(name)), ptr(value), uint32(len(value)))
}

func (host) SendLocalResponse(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) error {
	hm := encodeHeaderMap(headers)
	st := proxySendLocalResponse(status, ptr(details), uint32(len(details)), bptr(body), uint32(len(body)),
		bptr(hm), uint32(len(hm)), grpcStatus)
	if st != statusOK {
		return statusError(st)
	}
	return nil
}

// bufferBytes reads a whole VM or plugin configuration buffer.
func bufferBytes(typ, size uint32) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	unpin()
	defer unpin()
	var data, n uint32
	if st := proxyGetBufferBytes(typ, 0, size, &data, &n); st != statusOK {
		return nil, statusError(st)
	}
	b, ok := returned(data, n)
	if !ok {
		return nil, errBadReturn
	}
	return b, nil
}
