package filter

import (
	"encoding/base64"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/config"
)

func TestNormalizeIP(t *testing.T) {
	tests := []struct{ input, expected string }{
		{"192.0.2.1:8080", "192.0.2.1"},
		{"192.0.2.1", "192.0.2.1"}, // ngx_wasm_module: no port
		{"[2001:db8::1]:443", "2001:db8::1"},
		{"2001:db8::1", "2001:db8::1"}, // ngx_wasm_module IPv6
		{"[::ffff:192.0.2.9]:1", "192.0.2.9"},
		{"::ffff:192.0.2.9", "192.0.2.9"},
		{"2001:DB8:0:0::1", "2001:db8::1"},
		{"[fe80::1%eth0]:80", "fe80::1"},
		{"not-an-ip:1", "not-an-ip"},
		{"unix:/var/run/sock", "unix:/var/run/sock"}, // a pipe: not an address, kept whole
	}
	for _, tc := range tests {
		if got := normalizeIP(tc.input); got != tc.expected {
			t.Errorf("normalizeIP(%q): got %q, want %q", tc.input, got, tc.expected)
		}
	}
}

func TestQueryParam(t *testing.T) {
	tests := []struct {
		query, name, expected string
		ok                    bool
	}{
		{"a=1&b=2", "b", "2", true},
		{"a=1&a=2", "a", "1", true},
		{"tenant=acme%20corp", "tenant", "acme corp", true},
		{"tenant=a+b", "tenant", "a b", true},
		{"ten%61nt=x", "tenant", "x", true},
		{"flag", "flag", "", true},
		{"x=%zz", "x", "", false},
		{"x=%2", "x", "", false},
		{"", "x", "", false},
		{"y=1", "x", "", false},
	}
	for _, tc := range tests {
		got, ok := queryParam(tc.query, tc.name)
		if got != tc.expected || ok != tc.ok {
			t.Errorf("queryParam(%q, %q): got %q %v, want %q %v", tc.query, tc.name, got, ok, tc.expected, tc.ok)
		}
	}
}

func TestJWTClaims(t *testing.T) {
	enc := base64.RawURLEncoding.EncodeToString
	tok := func(payload string) string {
		return enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(payload)) + ".sig"
	}
	padded := func(payload string) string {
		return base64.URLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." + base64.URLEncoding.EncodeToString([]byte(payload)) + ".sig"
	}
	claims := `{"sub":"u1","plan":"pro","n":42,"f":1.5,"b":true,"no":false,"arr":[1],"obj":{"a":1},"nul":null}`
	tests := []struct {
		name, auth, claim, expected string
		ok                          bool
	}{
		{"string", "Bearer " + tok(claims), "sub", "u1", true},
		{"scheme case", "bearer " + tok(claims), "plan", "pro", true},
		{"number", "Bearer " + tok(claims), "n", "42", true},
		{"float", "Bearer " + tok(claims), "f", "1.5", true},
		{"true", "Bearer " + tok(claims), "b", "true", true},
		{"false", "Bearer " + tok(claims), "no", "false", true},
		{"array", "Bearer " + tok(claims), "arr", "", false},
		{"object", "Bearer " + tok(claims), "obj", "", false},
		{"null", "Bearer " + tok(claims), "nul", "", false},
		{"missing claim", "Bearer " + tok(claims), "email", "", false},
		{"padded base64", "Bearer " + padded(claims), "sub", "u1", true},
		{"not bearer", "Basic " + tok(claims), "sub", "", false},
		{"no scheme", tok(claims), "sub", "", false},
		{"two segments", "Bearer a.b", "sub", "", false},
		{"four segments", "Bearer a.b.c.d", "sub", "", false},
		{"bad base64", "Bearer a.!!!.c", "sub", "", false},
		{"not json", "Bearer " + tok("hello"), "sub", "", false},
		{"json array", "Bearer " + tok(`["sub"]`), "sub", "", false},
		{"json string", "Bearer " + tok(`"sub"`), "sub", "", false},
		{"too long", "Bearer " + tok(`{"sub":"`+strings.Repeat("x", maxJWTLen)+`"}`), "sub", "", false},
		{"nested path is not a claim", "Bearer " + tok(claims), "obj.a", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := claim(parseBearerJWT(tc.auth), tc.claim)
			if got != tc.expected || ok != tc.ok {
				t.Errorf("got %q %v, want %q %v", got, ok, tc.expected, tc.ok)
			}
		})
	}
}

func TestParseCost(t *testing.T) {
	tests := []struct {
		input    string
		expected float64
		ok       bool
	}{
		{"5", 5, true}, {"2.5", 2.5, true}, {" 7 ", 7, true}, {"\t3", 3, true}, {"0.001", 0.001, true},
		{"", 0, false}, {"abc", 0, false}, {"-1", 0, false}, {"+1", 0, false}, {"0", 0, false}, {"0.0", 0, false},
		{"1e309", 0, false}, {"1e3", 0, false}, {"NaN", 0, false}, {"Inf", 0, false}, {"0x10", 0, false},
		{"1.", 0, false}, {".5", 0, false}, {"1.2.3", 0, false}, {"1_000", 0, false}, {"٣", 0, false},
		{strings.Repeat("9", 33), 0, false}, {strings.Repeat("9", 32), 1e32 - 1, true},
	}
	for _, tc := range tests {
		got, ok := ParseCost(tc.input)
		if ok != tc.ok || (ok && got != tc.expected) {
			t.Errorf("ParseCost(%q): got %v %v, want %v %v", tc.input, got, ok, tc.expected, tc.ok)
		}
	}
}

func TestSelectorMatches(t *testing.T) {
	sel := config.Selector{PathPrefix: "/api/", Methods: []string{"GET", "POST"}, Hosts: []string{"example.com", "*.example.org"}}
	tests := []struct {
		method, path, host string
		expected           bool
	}{
		{"GET", "/api/x", "example.com", true},
		{"post", "/api/x?y=1", "EXAMPLE.com:8080", true},
		{"GET", "/api/x", "a.example.org", true},
		{"GET", "/api/x", "example.org", false},
		{"DELETE", "/api/x", "example.com", false},
		{"GET", "/apix", "example.com", false},
		{"GET", "/api/x", "evil.com", false},
	}
	for _, tc := range tests {
		h := &headerHost{headers: map[string]string{":method": tc.method, ":path": tc.path, ":authority": tc.host}}
		r := request{host: h}
		if got := selectorMatches(&sel, &r); got != tc.expected {
			t.Errorf("%s %s host %s: got %v, want %v", tc.method, tc.path, tc.host, got, tc.expected)
		}
	}
}

// headerHost is a minimal Host for descriptor tests.
type headerHost struct {
	Host
	headers map[string]string
	// more holds further lines of a repeated header, after headers[name].
	more map[string][]string
}

func (h *headerHost) RequestHeader(name string) (string, bool) {
	v, ok := h.headers[name]
	return v, ok
}

func (h *headerHost) RequestHeaderAll(name string) (string, bool) {
	v, ok := h.headers[name]
	if !ok {
		return "", false
	}
	return strings.Join(append([]string{v}, h.more[name]...), ", "), true
}

func TestClientIPFromXFF(t *testing.T) {
	tests := []struct {
		name     string
		hops     int
		xff      string // "-" = no header
		expected string
	}{
		{"no hops ignores spoofed xff", 0, "6.6.6.6", "192.0.2.1"},
		{"no header", 1, "-", "192.0.2.1"},
		{"one hop: rightmost", 1, "6.6.6.6, 203.0.113.9", "203.0.113.9"},
		{"two hops", 2, "203.0.113.9,10.0.0.2", "203.0.113.9"},
		{"spoof left of trusted entries changes nothing", 1, "1.1.1.1, 2.2.2.2, 203.0.113.9", "203.0.113.9"},
		{"too few entries", 3, "203.0.113.9, 10.0.0.2", "192.0.2.1"},
		{"garbage entry", 1, "6.6.6.6, not-an-ip", "192.0.2.1"},
		{"empty entry", 1, "6.6.6.6,", "192.0.2.1"},
		{"ipv6 and mapped", 1, "::ffff:203.0.113.7", "203.0.113.7"},
		{"ipv4 with port", 1, "6.6.6.6, 203.0.113.9:1234", "203.0.113.9"},
		{"ipv6 with port", 1, "6.6.6.6, [2001:DB8::1]:80", "2001:db8::1"},
		{"ipv6 in brackets", 2, "[2001:db8::1], 10.0.0.2:9", "2001:db8::1"},
		{"bare ipv6 is not a port", 1, "2001:db8::1", "2001:db8::1"},
		{"bad port", 1, "203.0.113.9:http", "192.0.2.1"},
		// A trusted proxy that adds its own line: the lines are one list.
		{"repeated lines, one hop", 1, "6.6.6.6|203.0.113.9", "203.0.113.9"},
		{"repeated lines, two hops", 2, "7.7.7.7, 6.6.6.6|203.0.113.9, 10.0.0.2", "203.0.113.9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &propHost{headerHost: headerHost{headers: map[string]string{}}, addr: "192.0.2.1:5000"}
			if tc.xff != "-" {
				lines := strings.Split(tc.xff, "|")
				h.headers["x-forwarded-for"] = lines[0]
				h.more = map[string][]string{"x-forwarded-for": lines[1:]}
			}
			r := request{host: h, xffHops: tc.hops}
			if got, _ := r.clientIP(); got != tc.expected {
				t.Errorf("got %q, want %q", got, tc.expected)
			}
		})
	}
}

// Trusted CIDRs work as Envoy's xff_trusted_cidrs: only a trusted peer's
// x-forwarded-for counts, and the client is the right-most untrusted entry.
func TestClientIPFromTrustedCIDRs(t *testing.T) {
	cfg, err := config.Parse([]byte(`{"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":1}}],
		"settings":{"xff_trusted_cidrs":["10.0.0.0/8","2001:db8::/32","192.0.2.7/32"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, peer, xff, expected string
	}{
		{"untrusted peer: xff ignored", "198.51.100.1:5000", "6.6.6.6", "198.51.100.1"},
		{"trusted peer: right-most untrusted", "10.1.1.1:5000", "6.6.6.6, 203.0.113.9, 10.0.0.3", "203.0.113.9"},
		{"ports and ipv6 proxies skipped", "[2001:db8::5]:80", "203.0.113.9:555, [2001:db8::9]:1, 10.9.9.9:2", "203.0.113.9"},
		{"all trusted: left-most", "10.1.1.1:5000", "10.0.0.1, 10.0.0.2", "10.0.0.1"},
		{"garbage stops the walk: the peer", "10.1.1.1:5000", "6.6.6.6, junk, 10.0.0.3", "10.1.1.1"},
		{"no header: the peer", "192.0.2.7:1", "-", "192.0.2.7"},
		{"repeated lines are one list", "10.1.1.1:5000", "6.6.6.6|203.0.113.9|10.0.0.3", "203.0.113.9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &propHost{headerHost: headerHost{headers: map[string]string{}}, addr: tc.peer}
			if tc.xff != "-" {
				lines := strings.Split(tc.xff, "|")
				h.headers["x-forwarded-for"] = lines[0]
				h.more = map[string][]string{"x-forwarded-for": lines[1:]}
			}
			r := request{host: h, xffCIDRs: cfg.Settings.XFFTrustedCIDRs}
			if got, _ := r.clientIP(); got != tc.expected {
				t.Errorf("got %q, want %q", got, tc.expected)
			}
		})
	}
}

type propHost struct {
	headerHost
	addr string
}

func (h *propHost) Property(path ...string) ([]byte, bool) {
	if strings.Join(path, ".") == "source.address" {
		return []byte(h.addr), true
	}
	return nil, false
}

// TestRequestForget: a request reused for another (initRequest, forget)
// answers every lookup as a fresh one does, whatever the previous request
// had cached (more than eight headers, a JWT, an address); and forget
// leaves nothing different from a zero request but values read only once
// their done flag is set and the header cache's stale entries (a field
// added to request must be reset there, or named here).
func TestRequestForget(t *testing.T) {
	enc := base64.RawURLEncoding.EncodeToString
	bearer := "Bearer " + enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(`{"sub":"u1","plan":"pro"}`)) + ".sig"
	full := map[string]string{
		":path": "/a/b?tenant=t1&x=%41", ":method": "POST", ":authority": "Example.COM:8443",
		"authorization": bearer, "x-api-key": "k1",
	}
	for i := range 10 {
		full["h"+strconv.Itoa(i)] = "v" + strconv.Itoa(i)
	}
	hosts := map[string]*propHost{
		"full":        {headerHost: headerHost{headers: full}, addr: "10.0.0.1:5000"},
		"bare":        {headerHost: headerHost{headers: map[string]string{}}},
		"other":       {headerHost: headerHost{headers: map[string]string{":path": "/c", ":method": "GET", "host": "b.example", "h3": "w3"}}, addr: "[2001:db8::1]:80"},
		"no token":    {headerHost: headerHost{headers: map[string]string{"authorization": "Basic x"}}, addr: "192.0.2.7"},
		"bad address": {headerHost: headerHost{headers: map[string]string{}}, addr: "not-an-ip"},
	}
	descs := []config.Descriptor{
		{Kind: config.DescIP}, {Kind: config.DescPath}, {Kind: config.DescMethod}, {Kind: config.DescHost},
		{Kind: config.DescQuery, Name: "tenant"}, {Kind: config.DescQuery, Name: "x"},
		{Kind: config.DescJWT, Name: "sub"}, {Kind: config.DescJWT, Name: "plan"},
		{Kind: config.DescHeader, Name: "x-api-key"}, {Kind: config.DescHeader, Name: "authorization"},
	}
	for i := range 10 {
		descs = append(descs, config.Descriptor{Kind: config.DescHeader, Name: "h" + strconv.Itoa(i)})
	}
	lookAll := func(r *request) []string {
		var got []string
		for _, d := range descs {
			v, ok := r.value(d)
			got = append(got, d.String()+"="+v+" "+strconv.FormatBool(ok))
		}
		p, v := r.identityParts()
		return append(got, "identity="+p+v)
	}
	for prevName, prev := range hosts {
		for nextName, next := range hosts {
			t.Run(prevName+" then "+nextName, func(t *testing.T) {
				r := request{host: prev, v6Prefix: 64}
				lookAll(&r)
				r.host = next
				r.forget()
				fresh := request{host: next, v6Prefix: 64}
				if got, want := lookAll(&r), lookAll(&request{host: next, v6Prefix: 64}); !slices.Equal(got, want) {
					t.Errorf("reused request:\ngot  %q\nwant %q", got, want)
				}
				r.host = next
				r.forget()
				// What forget leaves: values behind a done flag, the
				// header cache past its count.
				r.path, r.query, r.method, r.authority = "", "", "", ""
				r.hdrs, r.more = [len(r.hdrs)]headerValue{}, nil
				if !reflect.DeepEqual(r, fresh) {
					t.Errorf("forget left state a zero request lacks:\ngot  %+v\nwant %+v", r, fresh)
				}
			})
		}
	}
}

// TestMatchesAllNamesEverySelectorField: collect skips selectorMatches for
// a selector matchesAll calls empty, so matchesAll must see every field of
// config.Selector: one set alone makes the selector not empty. A field
// added to Selector fails here until matchesAll checks it.
func TestMatchesAllNamesEverySelectorField(t *testing.T) {
	if !matchesAll(&config.Selector{}) {
		t.Fatal("matchesAll(empty selector): got false")
	}
	if !selectorMatches(&config.Selector{}, &request{}) {
		t.Fatal("selectorMatches(empty selector): got false")
	}
	typ := reflect.TypeOf(config.Selector{})
	for i := range typ.NumField() {
		var s config.Selector
		f := reflect.ValueOf(&s).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString("/x")
		case reflect.Slice:
			f.Set(reflect.Append(f, reflect.ValueOf("X")))
		default:
			t.Fatalf("field %s: kind %s this test cannot set", typ.Field(i).Name, f.Kind())
		}
		if matchesAll(&s) {
			t.Errorf("matchesAll with only %s set: got true", typ.Field(i).Name)
		}
	}
}
