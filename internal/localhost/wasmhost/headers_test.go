package wasmhost

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func TestEncodeHeaders(t *testing.T) {
	tests := []struct {
		name     string
		input    []Header
		expected []byte
	}{
		{name: "empty", input: nil, expected: []byte{0, 0, 0, 0}},
		{
			name:  "two pairs",
			input: []Header{{":status", "429"}, {"a", ""}},
			expected: []byte{
				2, 0, 0, 0,
				7, 0, 0, 0, 3, 0, 0, 0,
				1, 0, 0, 0, 0, 0, 0, 0,
				':', 's', 't', 'a', 't', 'u', 's', 0, '4', '2', '9', 0,
				'a', 0, 0,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := EncodeHeaders(tc.input)
			if !bytes.Equal(got, tc.expected) {
				t.Errorf("EncodeHeaders(%v):\ngot  %v\nwant %v", tc.input, got, tc.expected)
			}
			back, err := DecodeHeaders(got)
			if err != nil {
				t.Fatalf("DecodeHeaders(EncodeHeaders(x)): %v", err)
			}
			if len(back) != len(tc.input) || (len(back) > 0 && !reflect.DeepEqual(back, tc.input)) {
				t.Errorf("round trip: got %v, want %v", back, tc.input)
			}
		})
	}
}

func TestDecodeHeaders(t *testing.T) {
	good := EncodeHeaders([]Header{{"x-a", "1"}, {"X-B", "two"}})
	tooMany := []byte{0x01, 0x04, 0, 0} // 1025 pairs
	tests := []struct {
		name        string
		input       []byte
		expected    []Header
		expectedErr string
	}{
		{name: "nil is empty", input: nil, expected: nil},
		{name: "count only", input: []byte{0, 0, 0, 0}, expected: []Header{}},
		{name: "two pairs, names kept as sent", input: good, expected: []Header{{"x-a", "1"}, {"X-B", "two"}}},
		{name: "short count", input: []byte{1, 0}, expectedErr: "header map: truncated"},
		{name: "sizes cut", input: good[:10], expectedErr: "header map: truncated"},
		{name: "data cut", input: good[:len(good)-1], expectedErr: "header map: pair 1 value: header map: truncated"},
		{name: "trailing bytes", input: append(append([]byte(nil), good...), 'x'), expectedErr: "header map: 1 trailing bytes"},
		{name: "missing NUL", input: func() []byte {
			b := append([]byte(nil), good...)
			b[4+16+3] = 'z' // the NUL after "x-a"
			return b
		}(), expectedErr: "header map: pair 0 name: missing NUL terminator at offset 23"},
		{name: "too many pairs", input: tooMany, expectedErr: "header map: 1025 pairs exceeds the limit of 1024"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeHeaders(tc.input)
			if tc.expectedErr != "" {
				if err == nil || err.Error() != tc.expectedErr {
					t.Fatalf("DecodeHeaders: got error %v, want %q", err, tc.expectedErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeHeaders: %v", err)
			}
			if len(got) != len(tc.expected) || (len(got) > 0 && !reflect.DeepEqual(got, tc.expected)) {
				t.Errorf("got %v, want %v", got, tc.expected)
			}
		})
	}
}

func FuzzDecodeHeaders(f *testing.F) {
	f.Add(EncodeHeaders([]Header{{"a", "b"}, {":path", "/x?y"}}))
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		hs, err := DecodeHeaders(b)
		if err != nil {
			return
		}
		if len(b) > 0 && !bytes.Equal(EncodeHeaders(hs), b) {
			t.Errorf("decoded %v does not re-encode to the input", hs)
		}
	})
}

func TestHeaderMap(t *testing.T) {
	start := []Header{{":path", "/"}, {"x-a", "1"}, {"x-b", "2"}, {"x-a", "3"}}
	tests := []struct {
		name     string
		edit     func(m *HeaderMap)
		expected string
	}{
		{"add keeps existing", func(m *HeaderMap) { m.add("X-A", "4") }, ":path=/ x-a=1 x-b=2 x-a=3 x-a=4"},
		{"replace sets first, drops others", func(m *HeaderMap) { m.replace("X-A", "9") }, ":path=/ x-a=9 x-b=2"},
		{"replace absent appends", func(m *HeaderMap) { m.replace("x-c", "5") }, ":path=/ x-a=1 x-b=2 x-a=3 x-c=5"},
		{"remove all values", func(m *HeaderMap) { m.remove("X-a") }, ":path=/ x-b=2"},
		{"remove absent", func(m *HeaderMap) { m.remove("nope") }, ":path=/ x-a=1 x-b=2 x-a=3"},
		{"set lower-cases", func(m *HeaderMap) { m.set([]Header{{"Content-Type", "a/b"}}) }, "content-type=a/b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &HeaderMap{h: append([]Header(nil), start...)}
			tc.edit(m)
			var parts []string
			for _, h := range m.h {
				parts = append(parts, h.Name+"="+h.Value)
			}
			if got := strings.Join(parts, " "); got != tc.expected {
				t.Errorf("got %q, want %q", got, tc.expected)
			}
		})
	}
	m := &HeaderMap{h: start}
	if v, ok := m.get("X-A"); !ok || v != "1" {
		t.Errorf("get(X-A) = %q, %v; want the first value \"1\", true", v, ok)
	}
	if _, ok := m.get("x-missing"); ok {
		t.Errorf("get(x-missing) found a value")
	}
}
