package wasmhost

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Header is one header or pseudo-header of a header map. Names are stored
// lower-case, as HTTP/2 and Envoy's header maps do.
type Header struct {
	Name  string
	Value string
}

// HeaderMap is an ordered multimap of lower-case header names, like Envoy's
// HeaderMap: pseudo-headers first, repeated names allowed. The zero value
// is an empty map.
type HeaderMap struct {
	h []Header
}

// NewHeaderMap returns a map of hs, lower-casing names.
func NewHeaderMap(hs []Header) *HeaderMap {
	m := &HeaderMap{}
	m.set(hs)
	return m
}

// Headers returns the headers in order (the map's own storage).
func (m *HeaderMap) Headers() []Header { return m.h }

// Get returns the first value of name.
func (m *HeaderMap) Get(name string) (string, bool) { return m.get(name) }

// Add appends a header, keeping any existing values of the same name.
func (m *HeaderMap) Add(name, value string) { m.add(name, value) }

// Replace sets the first value of name and drops the others, or appends
// the header if it is absent.
func (m *HeaderMap) Replace(name, value string) { m.replace(name, value) }

// Remove drops every value of name.
func (m *HeaderMap) Remove(name string) { m.remove(name) }

// get returns the first value of name, as Envoy's getHeaderMapValue does.
func (m *HeaderMap) get(name string) (string, bool) {
	name = strings.ToLower(name)
	for _, h := range m.h {
		if h.Name == name {
			return h.Value, true
		}
	}
	return "", false
}

// add appends a header, keeping any existing values of the same name.
func (m *HeaderMap) add(name, value string) {
	m.h = append(m.h, Header{Name: strings.ToLower(name), Value: value})
}

// replace sets the first value of name in place and drops the others, or
// appends the header if it is absent (Envoy's setCopy).
func (m *HeaderMap) replace(name, value string) {
	name = strings.ToLower(name)
	out := m.h[:0]
	done := false
	for _, h := range m.h {
		if h.Name == name {
			if done {
				continue
			}
			h.Value = value
			done = true
		}
		out = append(out, h)
	}
	m.h = out
	if !done {
		m.h = append(m.h, Header{Name: name, Value: value})
	}
}

// remove drops every value of name.
func (m *HeaderMap) remove(name string) {
	name = strings.ToLower(name)
	out := m.h[:0]
	for _, h := range m.h {
		if h.Name != name {
			out = append(out, h)
		}
	}
	m.h = out
}

// set replaces the whole map, lower-casing names.
func (m *HeaderMap) set(hs []Header) {
	m.h = m.h[:0]
	for _, h := range hs {
		m.add(h.Name, h.Value)
	}
}

// clone returns a copy of the headers.

// Limits proxy-wasm-cpp-host applies when it decodes a header map.
const (
	maxPairsBytes = 1 << 20 // PROXY_WASM_HOST_PAIRS_MAX_BYTES
	maxPairsCount = 1 << 10 // PROXY_WASM_HOST_PAIRS_MAX_COUNT
)

// EncodeHeaders serializes headers in the proxy-wasm wire format: u32 count
// N, then N × (u32 name length, u32 value length), then each name and each
// value followed by a NUL byte; integers are little-endian and lengths
// exclude the NUL. Zero headers encode as the 4-byte count 0.
func EncodeHeaders(hs []Header) []byte {
	size := 4
	for _, h := range hs {
		size += 8 + len(h.Name) + 1 + len(h.Value) + 1
	}
	b := make([]byte, size)
	binary.LittleEndian.PutUint32(b, uint32(len(hs)))
	p := 4
	for _, h := range hs {
		binary.LittleEndian.PutUint32(b[p:], uint32(len(h.Name)))
		binary.LittleEndian.PutUint32(b[p+4:], uint32(len(h.Value)))
		p += 8
	}
	for _, h := range hs {
		p += copy(b[p:], h.Name) + 1
		p += copy(b[p:], h.Value) + 1
	}
	return b
}

// errShortHeaders reports a header map that ends before its lengths say.
var errShortHeaders = errors.New("header map: truncated")

// DecodeHeaders parses the proxy-wasm header map wire format (see
// EncodeHeaders). An empty input is an empty map. It is strict: the NUL
// terminators must be present and no bytes may follow the last value.
// Names are returned as sent; the host lower-cases them when it stores them.
func DecodeHeaders(b []byte) ([]Header, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) > maxPairsBytes {
		return nil, fmt.Errorf("header map: %d bytes exceeds the limit of %d", len(b), maxPairsBytes)
	}
	if len(b) < 4 {
		return nil, errShortHeaders
	}
	n := binary.LittleEndian.Uint32(b)
	if n > maxPairsCount {
		return nil, fmt.Errorf("header map: %d pairs exceeds the limit of %d", n, maxPairsCount)
	}
	p := 4
	if uint64(len(b)-p) < uint64(n)*8 {
		return nil, errShortHeaders
	}
	sizes := make([][2]uint32, n)
	for i := range sizes {
		sizes[i] = [2]uint32{binary.LittleEndian.Uint32(b[p:]), binary.LittleEndian.Uint32(b[p+4:])}
		p += 8
	}
	hs := make([]Header, n)
	for i, s := range sizes {
		var err error
		var name, value string
		if name, p, err = cstring(b, p, s[0]); err != nil {
			return nil, fmt.Errorf("header map: pair %d name: %w", i, err)
		}
		if value, p, err = cstring(b, p, s[1]); err != nil {
			return nil, fmt.Errorf("header map: pair %d value: %w", i, err)
		}
		hs[i] = Header{Name: name, Value: value}
	}
	if p != len(b) {
		return nil, fmt.Errorf("header map: %d trailing bytes", len(b)-p)
	}
	return hs, nil
}

// cstring reads n bytes at p followed by a NUL and returns the string and
// the offset after the NUL.
func cstring(b []byte, p int, n uint32) (string, int, error) {
	if uint64(n)+1 > uint64(len(b)-p) {
		return "", 0, errShortHeaders
	}
	end := p + int(n)
	if b[end] != 0 {
		return "", 0, fmt.Errorf("missing NUL terminator at offset %d", end)
	}
	return string(b[p:end]), end + 1, nil
}
