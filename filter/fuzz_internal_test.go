package filter

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/guest/lite"
)

// Fuzz targets for descriptor extraction (issue 6, "Fuzzing"); seed corpora
// in testdata/fuzz/<target>.

// FuzzJWTClaims: parseBearerJWT never panics, returns an object or nothing,
// and ignores tokens over maxJWTLen; for a token built from a fuzzed payload
// it agrees with encoding/json on whether the payload is a JSON object and
// on the value of the (first) claim called name.
func FuzzJWTClaims(f *testing.F) {
	f.Add("Bearer a.b.c", []byte(`{"sub":"u1","n":42,"b":true,"a":[1],"o":{}}`), "sub")
	f.Add("bearer x", []byte(`{"sub":"a","sub":"b"}`), "sub")
	f.Add("", []byte(`["sub"]`), "n")
	f.Fuzz(func(t *testing.T, auth string, payload []byte, name string) {
		// Any Authorization header.
		c := parseBearerJWT(auth)
		if c.Exists() && !c.IsObject() {
			t.Fatalf("parseBearerJWT(%q) returned a %v", auth, c.Type)
		}
		if c.Exists() && len(auth) > len("bearer ")+maxJWTLen && len(strings.TrimSpace(auth[len("bearer "):])) > maxJWTLen {
			t.Fatalf("a %d-byte token was decoded", len(auth))
		}
		if v, ok := claim(c, name); ok && !c.Exists() {
			t.Fatalf("claim %q = %q from no token", name, v)
		}

		// A well-formed token around the fuzzed payload.
		enc := base64.RawURLEncoding.EncodeToString
		tok := enc([]byte(`{"alg":"none"}`)) + "." + enc(payload) + ".sig"
		c = parseBearerJWT("Bearer " + tok)
		wantObject := json.Valid(payload) && bytes.HasPrefix(bytes.TrimLeft(payload, " \t\r\n"), []byte("{"))
		if len(tok) > maxJWTLen {
			if c.Exists() {
				t.Fatalf("a %d-byte token was decoded", len(tok))
			}
			return
		}
		if !utf8.Valid(payload) {
			return // encoding/json replaces bad UTF-8; gjson keeps it
		}
		// A payload that repeats a top-level key is no token.
		wantObject = wantObject && !repeatsMember(payload)
		if c.Exists() != wantObject {
			t.Fatalf("payload %q: decoded %v, encoding/json says object %v", payload, c.Exists(), wantObject)
		}
		if !wantObject {
			return
		}
		got, ok := claim(c, name)
		raw, found := firstMember(payload, name)
		var want string
		wantOK := false
		switch {
		case !found:
		case raw[0] == '"':
			wantOK = json.Unmarshal(raw, &want) == nil
		case raw[0] == '-' || '0' <= raw[0] && raw[0] <= '9':
			want, wantOK = string(raw), true
		case string(raw) == "true" || string(raw) == "false":
			want, wantOK = string(raw), true
		}
		if got != want || ok != wantOK {
			t.Fatalf("payload %q claim %q: got %q %v, want %q %v", payload, name, got, ok, want, wantOK)
		}
	})
}

// repeatsMember reports whether the JSON object payload names a member
// twice, as encoding/json reads the names.
func repeatsMember(payload []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(payload))
	if _, err := dec.Token(); err != nil {
		return false
	}
	seen := map[any]bool{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil || seen[k] {
			return err == nil
		}
		seen[k] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return false
		}
	}
	return false
}

// firstMember returns the raw value of the first member called name of the
// JSON object payload.
func firstMember(payload []byte, name string) (json.RawMessage, bool) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		if k == name {
			return raw, true
		}
	}
	return nil, false
}

// FuzzDescriptorValues: the client address, x-forwarded-for, query and host
// helpers never panic, never make a value longer than their input, and
// return canonical IP addresses.
func FuzzDescriptorValues(f *testing.F) {
	f.Add("[::ffff:192.0.2.1]:80", "6.6.6.6, 203.0.113.9", uint8(1), "a=1&ten%61nt=x+y&b", "tenant", "Example.COM:8080")
	f.Add("192.0.2.1", ",,,", uint8(3), "x=%zz", "x", "[::1]:443")
	f.Fuzz(func(t *testing.T, addr, xff string, hops uint8, query, name, host string) {
		ip := normalizeIP(addr)
		if len(ip) > len(addr) || !strings.Contains(addr, ip) && !isCanonicalIP(ip) {
			t.Fatalf("normalizeIP(%q) = %q", addr, ip)
		}
		if a, err := netip.ParseAddr(ip); err == nil && a.Unmap().WithZone("").String() != ip {
			t.Fatalf("normalizeIP(%q) = %q, not canonical", addr, ip)
		}

		n := int(hops%config.MaxXFFHops) + 1
		if got, ok := forwardedFor(xff, n); ok {
			if !isCanonicalIP(got) {
				t.Fatalf("forwardedFor(%q, %d) = %q, not a canonical IP", xff, n, got)
			}
			entries := strings.Split(xff, ",")
			if len(entries) < n {
				t.Fatalf("forwardedFor(%q, %d) = %q from %d entries", xff, n, got, len(entries))
			}
			e, _ := netip.ParseAddr(xffEntry(entries[len(entries)-n]))
			if e.Unmap().WithZone("").String() != got {
				t.Fatalf("forwardedFor(%q, %d) = %q, entry %d from the right is %q", xff, n, got, n, entries[len(entries)-n])
			}
		}

		if v, ok := queryParam(query, name); ok && len(v) > len(query) {
			t.Fatalf("queryParam(%q, %q) = %q", query, name, v)
		}
		if h := stripPort(host); !strings.HasPrefix(host, h) {
			t.Fatalf("stripPort(%q) = %q", host, h)
		}
		// The cached request accessors agree with the helpers.
		hh := &propHost{headerHost: headerHost{headers: map[string]string{
			":path": "/p?" + query, ":authority": host, "x-forwarded-for": xff}}, addr: addr}
		r := request{host: hh, xffHops: n}
		if v, ok := r.value(config.Descriptor{Kind: config.DescQuery, Name: name}); ok {
			if w, wok := queryParam(query, name); !wok || w != v {
				t.Fatalf("request query %q = %q, helper %q %v", name, v, w, wok)
			}
		}
		if got, want := r.hostValue(), lite.ToLowerASCII(stripPort(host)); got != want {
			t.Fatalf("host %q: got %q, want %q", host, got, want)
		}
		if got, ok := r.clientIP(); ok != (addr != "" || isCanonicalIP(got)) {
			t.Fatalf("clientIP with address %q, xff %q: got %q %v", addr, xff, got, ok)
		}
	})
}

func isCanonicalIP(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Unmap().WithZone("").String() == s
}
