package wasmhost

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"net"
	"strconv"
	"strings"
)

// property returns the value of a property path (segments separated by
// NUL, as the SDKs serialize them) and whether it exists.
//
// Envoy mode, strings as raw bytes and integers as 8-byte little-endian:
// source.address ("ip:port", "[v6]:port"), source.port, destination.address,
// destination.port, request.path (with query), request.url_path,
// request.host, request.method, request.scheme, request.id,
// request.protocol, response.code (in the response and log callbacks),
// plugin_name, plugin_root_id, plugin_vm_id, then anything the filter set
// with proxy_set_property. Kong mode: source.address without the port and
// integers as decimal strings, as ngx_wasm_module answers.
func (w *worker) property(path string) ([]byte, bool) {
	h := w.h
	switch path {
	case "plugin_name":
		return []byte(h.opts.PluginName), true
	case "plugin_root_id":
		return []byte(h.opts.RootID), true
	case "plugin_vm_id":
		return []byte(h.opts.VMID), true
	}
	// Segments are NUL-separated; "source.address" as one segment is not
	// source.address (Envoy looks up the first segment as a token).
	name := strings.ReplaceAll(path, "\x00", ".")
	if s := w.cur; s != nil && strings.HasPrefix(path, "metadata\x00") {
		return MetadataProperty(s.metadata, strings.Split(path, "\x00")[1:])
	}
	if s := w.cur; s != nil && !strings.Contains(path, ".") {
		if v, ok := s.builtin(name, h.opts.Kong); ok {
			return v, true
		}
	}
	v, ok := w.props()[path]
	return v, ok
}

// props returns the proxy_set_property values of the running context.
func (w *worker) props() map[string][]byte {
	if w.cur != nil {
		if w.cur.props == nil {
			w.cur.props = make(map[string][]byte)
		}
		return w.cur.props
	}
	if w.rootProps == nil {
		w.rootProps = make(map[string][]byte)
	}
	return w.rootProps
}

func (w *worker) setProperty(path string, value []byte) {
	w.props()[path] = value
}

// builtin answers the stream properties.
func (s *stream) builtin(name string, kong bool) ([]byte, bool) {
	str := func(v string) ([]byte, bool) { return []byte(v), true }
	num := func(n int64) ([]byte, bool) {
		if kong {
			return []byte(strconv.FormatInt(n, 10)), true
		}
		b := make([]byte, 8)
		binary.LittleEndian.PutUint64(b, uint64(n))
		return b, true
	}
	addr := func(hostport string) ([]byte, bool) {
		if hostport == "" {
			return nil, false
		}
		if kong {
			host, _, err := net.SplitHostPort(hostport)
			if err != nil {
				return str(hostport)
			}
			return str(host)
		}
		return str(hostport)
	}
	port := func(hostport string) ([]byte, bool) {
		_, p, err := net.SplitHostPort(hostport)
		if err != nil {
			return nil, false
		}
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, false
		}
		return num(n)
	}
	header := func(m *HeaderMap, k string) ([]byte, bool) {
		v, ok := m.get(k)
		if !ok {
			return nil, false
		}
		return str(v)
	}
	switch name {
	case "source.address":
		return addr(s.remoteAddr)
	case "source.port":
		return port(s.remoteAddr)
	case "destination.address":
		return addr(s.localAddr)
	case "destination.port":
		return port(s.localAddr)
	case "request.path":
		return header(&s.req, ":path")
	case "request.url_path":
		p, ok := s.req.get(":path")
		if !ok {
			return nil, false
		}
		if i := strings.IndexByte(p, '?'); i >= 0 {
			p = p[:i]
		}
		return str(p)
	case "request.host":
		return header(&s.req, ":authority")
	case "request.method":
		return header(&s.req, ":method")
	case "request.scheme":
		return header(&s.req, ":scheme")
	case "request.id":
		return header(&s.req, "x-request-id")
	case "request.protocol":
		return str(s.protocol)
	case "response.code":
		if s.phase < phaseResponseHeaders {
			return nil, false
		}
		c, err := strconv.ParseInt(mustGet(&s.resp, ":status"), 10, 64)
		if err != nil {
			return nil, false
		}
		return num(c)
	}
	return nil, false
}

// MetadataProperty answers a "metadata" property path (the segments after
// "metadata") from the dynamic metadata md as Envoy's CEL
// lookup does for a leaf of the dynamic metadata: a string as its bytes, a
// number as an 8-byte little-endian double, a boolean as one byte.
// Objects and lists are not answered (Envoy's encoding of them differs
// between releases).
func MetadataProperty(md map[string]map[string]any, path []string) ([]byte, bool) {
	if len(path) < 3 || path[0] != "filter_metadata" {
		return nil, false
	}
	ns, ok := md[path[1]]
	if !ok {
		return nil, false
	}
	var v any = map[string]any(ns)
	for _, seg := range path[2:] {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[seg]; !ok {
			return nil, false
		}
	}
	switch v := v.(type) {
	case string:
		return []byte(v), true
	case json.Number:
		f, err := v.Float64()
		if err != nil {
			return nil, false
		}
		return binary.LittleEndian.AppendUint64(nil, math.Float64bits(f)), true
	case bool:
		if v {
			return []byte{1}, true
		}
		return []byte{0}, true
	}
	return nil, false
}
