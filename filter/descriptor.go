package filter

import (
	"strings"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// maxJWTLen bounds the bearer token the filter decodes; a longer one counts
// as no token.
const maxJWTLen = 16 << 10

// request reads the attributes of the current request from the host, each at
// most once.
type request struct {
	host     Host
	ps       propertyStringer // host's, if it has it
	xffHops  int              // Settings.XFFTrustedHops
	v6Prefix int              // Settings.IPv6Prefix
	xffCIDRs []lite.CIDR      // Settings.XFFTrustedCIDRs
	jwtMeta  string           // Settings.JWTPayloadInMetadata

	pathDone, ipDone, jwtDone, methodDone, hostDone bool

	path, query string // from :path, split at '?'
	method      string
	authority   string
	ip          string
	ipOK        bool
	claims      ljson.Result // the JWT payload object; !Exists() if none

	// Cache of header lookups: the first ones in hdrs, without an
	// allocation, the rest in more.
	hdrs [8]headerValue
	nhdr int
	more []headerValue
}

// forget makes r's lookups start afresh, as in a zero request. It resets
// what a lookup reads before writing it (the done flags, ip and ipOK,
// claims, the header cache's count) and leaves the rest: every other
// cached value is read only once its done flag is set, and the header
// cache only up to its count (hdrs[:nhdr], more). Zeroing the whole
// request, its header cache included, costs every request about 580
// bytes of stores; TestRequestForget checks that nothing else is read.
func (r *request) forget() {
	r.pathDone, r.ipDone, r.jwtDone, r.methodDone, r.hostDone = false, false, false, false, false
	r.ip, r.ipOK = "", false
	r.claims = ljson.Result{}
	r.nhdr, r.more = 0, r.more[:0]
}

type headerValue struct {
	_           incomparable
	name, value string
	ok          bool
}

func (r *request) header(name string) (string, bool) {
	for i := range r.nhdr {
		if h := &r.hdrs[i]; h.name == name {
			return h.value, h.ok
		}
	}
	for _, h := range r.more {
		if h.name == name {
			return h.value, h.ok
		}
	}
	v, ok := r.host.RequestHeader(name)
	if r.nhdr < len(r.hdrs) {
		r.hdrs[r.nhdr] = headerValue{name: name, value: v, ok: ok}
		r.nhdr++
	} else {
		r.more = append(r.more, headerValue{name: name, value: v, ok: ok})
	}
	return v, ok
}

func (r *request) loadPath() {
	if r.pathDone {
		return
	}
	r.pathDone = true
	p, _ := r.header(":path")
	r.path, r.query, _ = strings.Cut(p, "?")
}

// urlPath returns the request path without the query string.
func (r *request) urlPath() string {
	r.loadPath()
	return r.path
}

func (r *request) methodValue() string {
	if !r.methodDone {
		r.methodDone = true
		r.method, _ = r.header(":method")
	}
	return r.method
}

// hostValue returns the lower-case host without port.
func (r *request) hostValue() string {
	if !r.hostDone {
		r.hostDone = true
		h, ok := r.header(":authority")
		if !ok {
			h, _ = r.header("host")
		}
		// "example.com." is the same host as "example.com" (a fully
		// qualified name); without this a client could leave the host's
		// selector and bucket by adding a dot.
		r.authority = strings.TrimSuffix(lite.ToLowerASCII(stripPort(h)), ".")
	}
	return r.authority
}

// clientIP returns the client address: from x-forwarded-for when proxies
// are trusted (Settings.XFFTrustedHops or XFFTrustedCIDRs), else from
// source.address; for IPv6, its network at Settings.IPv6Prefix.
func (r *request) clientIP() (string, bool) {
	if !r.ipDone {
		r.ipDone = true
		switch {
		case r.xffHops > 0:
			if xff, ok := r.host.RequestHeaderAll("x-forwarded-for"); ok {
				r.ip, r.ipOK = forwardedFor(xff, r.xffHops)
			}
		case len(r.xffCIDRs) > 0:
			if peer, ok := r.sourceAddress(); ok && trusted(r.xffCIDRs, peer) {
				if xff, ok := r.host.RequestHeaderAll("x-forwarded-for"); ok {
					r.ip, r.ipOK = forwardedForUntrusted(xff, r.xffCIDRs)
				}
			}
		}
		if !r.ipOK {
			if a, ok := r.sourceAddress(); ok {
				r.ip, r.ipOK = normalizeIP(a), true
			}
		}
		// An IPv6 client is its network (Settings.IPv6Prefix): a host
		// given a /64 could otherwise take a bucket per address.
		if r.ipOK && r.v6Prefix > 0 && r.v6Prefix < 128 && strings.IndexByte(r.ip, ':') >= 0 {
			if n, ok := lite.IPv6Prefix(r.ip, r.v6Prefix); ok {
				r.ip = n
			}
		}
	}
	return r.ip, r.ipOK
}

// sourceAddress returns the connection's peer, "ip:port" under Envoy.
func (r *request) sourceAddress() (string, bool) {
	if r.ps != nil {
		a, ok := r.ps.PropertyString(sourceAddress...)
		return a, ok && a != ""
	}
	b, ok := r.host.Property(sourceAddress...)
	return string(b), ok && len(b) > 0
}

// trusted reports whether addr ("ip", "ip:port", "[ip]:port") lies in one
// of the CIDRs.
func trusted(cidrs []lite.CIDR, addr string) bool {
	ip, ok := lite.ParseIP(lite.HostOfAddress(addr))
	if !ok {
		return false
	}
	for _, c := range cidrs {
		if c.Contains(ip) {
			return true
		}
	}
	return false
}

// xffEntry returns the address in one x-forwarded-for entry: spaces and
// tabs trimmed, a port dropped ("4.4.4.4:1234", "[2001:db8::1]:80").
func xffEntry(e string) string {
	return lite.HostOfAddress(strings.Trim(e, " \t"))
}

// forwardedFor returns the hops-th address from the right of an
// x-forwarded-for list (every header line joined), normalized, if it is
// there and is an IP address.
func forwardedFor(xff string, hops int) (string, bool) {
	for i := 1; ; i++ {
		j := strings.LastIndexByte(xff, ',')
		if i == hops {
			return lite.CanonicalIP(xffEntry(xff[j+1:]))
		}
		if j < 0 {
			return "", false
		}
		xff = xff[:j]
	}
}

// forwardedForUntrusted walks an x-forwarded-for list from the right past
// the entries in cidrs and returns the first that is not, or the left-most
// when all are, as Envoy's xff_trusted_cidrs does. An entry that is not an
// IP address ends the walk with nothing: the peer is used.
func forwardedForUntrusted(xff string, cidrs []lite.CIDR) (string, bool) {
	for {
		j := strings.LastIndexByte(xff, ',')
		entry := xffEntry(xff[j+1:])
		if _, ok := lite.ParseIP(entry); !ok {
			return "", false
		}
		if j < 0 || !trusted(cidrs, entry) {
			return lite.CanonicalIP(entry)
		}
		xff = xff[:j]
	}
}

// jwtAuthnNamespace is where Envoy's jwt_authn filter puts the verified
// payload (payload_in_metadata) in the dynamic metadata.
const jwtAuthnNamespace = "envoy.filters.http.jwt_authn"

// jwtClaim returns a claim: from the payload jwt_authn verified and put in
// the dynamic metadata when Settings.JWTPayloadInMetadata names it, else
// from the (unverified) bearer token in Authorization.
func (r *request) jwtClaim(name string) (string, bool) {
	if r.jwtMeta == "" {
		return claim(r.jwtClaims(), name)
	}
	// Envoy answers a property path into the metadata with the leaf
	// value: a string claim as its bytes.
	path := [...]string{"metadata", "filter_metadata", jwtAuthnNamespace, r.jwtMeta, name}
	if r.ps != nil {
		v, ok := r.ps.PropertyString(path[:]...)
		return v, ok && v != ""
	}
	b, ok := r.host.Property(path[:]...)
	return string(b), ok && len(b) > 0
}

// jwtClaims returns the payload of the bearer JWT in Authorization, or a
// Result that does not exist when there is none or it is malformed.
func (r *request) jwtClaims() ljson.Result {
	if r.jwtDone {
		return r.claims
	}
	r.jwtDone = true
	auth, ok := r.header("authorization")
	if !ok {
		return r.claims
	}
	r.claims = parseBearerJWT(auth)
	return r.claims
}

// parseBearerJWT decodes the payload of "Bearer <header>.<payload>.<sig>".
func parseBearerJWT(auth string) ljson.Result {
	const prefix = "bearer "
	if len(auth) <= len(prefix) || !lite.EqualFoldASCII(auth[:len(prefix)], prefix) {
		return ljson.Result{}
	}
	tok := strings.Trim(auth[len(prefix):], " \t")
	if len(tok) > maxJWTLen || strings.Count(tok, ".") != 2 {
		return ljson.Result{}
	}
	first := strings.IndexByte(tok, '.')
	second := first + 1 + strings.IndexByte(tok[first+1:], '.')
	seg := strings.TrimRight(tok[first+1:second], "=")
	payload, ok := lite.DecodeBase64(seg, true, false) // base64.RawURLEncoding
	if !ok || !ljson.Valid(payload) {
		return ljson.Result{}
	}
	res := ljson.ParseBytes(payload)
	if !res.IsObject() || hasDuplicateKey(res) {
		return ljson.Result{}
	}
	return res
}

// hasDuplicateKey reports whether an object names a top-level key twice
// (after unescaping: "\u0073ub" is "sub"). Readers disagree on such a
// payload: some take the first "sub" (our reader, gjson), Go's encoding/json and many
// verifiers the last. A token whose claims mean different things to the
// verifier and to the filter identifies no one, so the filter treats it as
// no token at all.
func hasDuplicateKey(obj ljson.Result) bool {
	var small [16]string
	keys := small[:0]
	var seen map[string]bool
	dup := false
	obj.ForEach(func(k, _ ljson.Result) bool {
		switch {
		case seen != nil:
			dup = seen[k.Str]
			seen[k.Str] = true
		case len(keys) < cap(keys):
			for _, p := range keys {
				if p == k.Str {
					dup = true
				}
			}
			keys = append(keys, k.Str)
		default:
			seen = make(map[string]bool, 2*len(keys))
			for _, p := range keys {
				seen[p] = true
			}
			dup = seen[k.Str]
			seen[k.Str] = true
		}
		return !dup
	})
	return dup
}

// claim returns a top-level claim as a string: strings as they are, numbers
// as written in the token, booleans as "true"/"false". Other types (objects,
// arrays, null) count as absent.
func claim(claims ljson.Result, name string) (string, bool) {
	if !claims.Exists() {
		return "", false
	}
	var v ljson.Result
	claims.ForEach(func(k, val ljson.Result) bool {
		if k.Str == name {
			v = val
			return false
		}
		return true
	})
	switch v.Type {
	case ljson.String:
		return v.Str, true
	case ljson.Number:
		return v.Raw, true
	case ljson.True:
		return "true", true
	case ljson.False:
		return "false", true
	}
	return "", false
}

// value returns the descriptor's value for this request.
func (r *request) value(d config.Descriptor) (string, bool) {
	switch d.Kind {
	case config.DescIP:
		return r.clientIP()
	case config.DescHeader:
		return r.header(d.Name)
	case config.DescQuery:
		r.loadPath()
		return queryParam(r.query, d.Name)
	case config.DescJWT:
		return r.jwtClaim(d.Name)
	case config.DescPath:
		p := r.urlPath()
		return p, p != ""
	case config.DescMethod:
		m := r.methodValue()
		return m, m != ""
	default:
		h := r.hostValue()
		return h, h != ""
	}
}

// identityParts returns what seeds a client's Retry-After jitter, as a
// prefix and a value so that it can be hashed without concatenating them:
// the JWT subject if there is one, otherwise the client IP, otherwise the
// path.
func (r *request) identityParts() (prefix, value string) {
	if sub, ok := r.jwtClaim("sub"); ok {
		return "sub:", sub
	}
	if ip, ok := r.clientIP(); ok {
		return "ip:", ip
	}
	return "path:", r.urlPath()
}

// identityHash is the FNV-1a hash of the identity's prefix and value.
func (r *request) identityHash() uint64 {
	prefix, v := r.identityParts()
	return fnv64Add(fnv64Add(fnvOffset, prefix), v)
}

// normalizeIP strips the port and IPv6 brackets from a source.address
// ("1.2.3.4:80", "[::1]:80", or, on ngx_wasm_module, "1.2.3.4" and "::1") and
// writes IPv4-mapped IPv6 addresses as IPv4. Unparseable input is returned
// as it was, so that it still identifies the client.
func normalizeIP(addr string) string {
	if ip, ok := lite.IPv4Host(addr); ok {
		return ip
	}
	host := lite.HostOfAddress(addr)
	if ip, ok := lite.CanonicalIP(host); ok {
		return ip
	}
	return host
}

// stripPort removes a trailing ":port" from a host, keeping IPv6 literals.
func stripPort(h string) string {
	if strings.HasPrefix(h, "[") {
		if end := strings.IndexByte(h, ']'); end > 0 {
			return h[:end+1]
		}
		return h
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 && strings.Count(h, ":") == 1 {
		return h[:i]
	}
	return h
}

// queryParam returns the first value of the named parameter in a raw query
// string, percent-decoded ('+' is a space). A parameter whose value cannot
// be decoded counts as absent.
func queryParam(query, name string) (string, bool) {
	for query != "" {
		var pair string
		pair, query, _ = strings.Cut(query, "&")
		k, v, _ := strings.Cut(pair, "=")
		if k != name {
			dk, ok := unescape(k)
			if !ok || dk != name {
				continue
			}
		}
		return unescape(v)
	}
	return "", false
}

func unescape(s string) (string, bool) {
	if !strings.ContainsAny(s, "%+") {
		return s, true
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '+':
			b = append(b, ' ')
		case '%':
			if i+2 >= len(s) {
				return "", false
			}
			hi, ok1 := unhex(s[i+1])
			lo, ok2 := unhex(s[i+2])
			if !ok1 || !ok2 {
				return "", false
			}
			b = append(b, hi<<4|lo)
			i += 2
		default:
			b = append(b, c)
		}
	}
	return string(b), true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// matchesAll reports whether selector s is empty, so that it matches every
// request without a lookup (the common case: collect then skips the call
// to selectorMatches). It must name every condition selectorMatches checks.
func matchesAll(s *config.Selector) bool {
	return s.PathPrefix == "" && len(s.Methods) == 0 && len(s.Hosts) == 0
}

// selectorMatches reports whether selector s matches the request.
func selectorMatches(s *config.Selector, r *request) bool {
	if s.PathPrefix != "" && !strings.HasPrefix(r.urlPath(), s.PathPrefix) {
		return false
	}
	if len(s.Methods) > 0 && !contains(s.Methods, lite.ToUpperASCII(r.methodValue())) {
		return false
	}
	if len(s.Hosts) > 0 {
		h := r.hostValue()
		ok := false
		for _, want := range s.Hosts {
			if want == h || strings.HasPrefix(want, "*.") && strings.HasSuffix(h, want[1:]) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}
