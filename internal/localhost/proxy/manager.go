package proxy

import (
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// Manager is what Envoy's HTTP connection manager does to a request before
// the filters see it, for the settings that change what they see. Written
// from Envoy's ConnectionManagerUtility (mutateRequestHeaders,
// maybeNormalizePath) and HeaderMapImpl. A nil *Manager leaves requests as
// they arrive, with the TCP peer as source.address.
type Manager struct {
	// NormalizePath applies RFC 3986 normalisation to the path: unreserved
	// characters percent-decoded, other escapes' hex upper-cased, dot
	// segments removed (normalize_path).
	NormalizePath bool
	// MergeSlashes collapses runs of '/' in the path (merge_slashes).
	MergeSlashes bool
	// EscapedSlashes is path_with_escaped_slashes_action: "KEEP_UNCHANGED"
	// (or ""), "REJECT_REQUEST" (400), "UNESCAPE_AND_REDIRECT" (307 to the
	// unescaped path) or "UNESCAPE_AND_FORWARD" (%2F and %5C, any case,
	// become '/' and '\').
	EscapedSlashes string
	// UseRemoteAddress: the client address is the TCP peer, or the
	// XFFNumTrustedHops-th x-forwarded-for entry from the right when that
	// is set, and the peer (the local address for a loopback peer) is
	// appended to x-forwarded-for unless SkipXFFAppend. Without it the
	// client address is the x-forwarded-for entry XFFNumTrustedHops from
	// the right (the right-most with 0), and nothing is appended. An
	// address from x-forwarded-for has port 0 in source.address.
	UseRemoteAddress  bool
	XFFNumTrustedHops int
	SkipXFFAppend     bool
	// MaxHeadersKB bounds the request headers (names and values, as
	// Envoy's codec counts them); over it the answer is 431. 0 means 60.
	MaxHeadersKB int
	// MaxHeadersCount bounds the number of request header lines
	// (common_http_protocol_options.max_headers_count); over it the
	// answer is 431. 0 means 100.
	MaxHeadersCount int
}

// Envoy's defaults for the codec limits, which apply with or without a
// Manager: max_request_headers_kb and max_headers_count
// (DEFAULT_MAX_REQUEST_HEADERS_KB, DEFAULT_MAX_HEADERS_COUNT in Envoy's
// source/common/http/utility.h).
const (
	defaultMaxHeadersKB    = 60
	defaultMaxHeadersCount = 100
)

// codecReply is what Envoy answers itself before any filter runs, for a
// request the HTTP/1 codec or the connection manager refuses: 431 over
// the header limits; 404 for a path that is not relative ("PRI *": the
// connection manager answers absolute_path; net/http answers "OPTIONS *"
// itself) and for CONNECT,
// which no route matches without a connect_matcher (Envoy runs the
// filters first and its router answers route_not_found; the local host
// answers before them). 0 lets the request through.
func codecReply(m *Manager, r *http.Request) int {
	maxKB, maxCount := defaultMaxHeadersKB, defaultMaxHeadersCount
	if m != nil && m.MaxHeadersKB > 0 {
		maxKB = m.MaxHeadersKB
	}
	if m != nil && m.MaxHeadersCount > 0 {
		maxCount = m.MaxHeadersCount
	}
	count := 1 // Host, which net/http keeps apart
	for _, vs := range r.Header {
		count += len(vs)
	}
	if count > maxCount || headersSize(r) > maxKB<<10 {
		return http.StatusRequestHeaderFieldsTooLarge
	}
	if r.Method == http.MethodConnect || !strings.HasPrefix(r.URL.Path, "/") {
		return http.StatusNotFound
	}
	return 0
}

// inlineRequestHeaders are the request headers Envoy keeps as one entry
// (its O(1) "inline" headers, INLINE_REQ_STRING_HEADERS and
// INLINE_REQ_RESP_STRING_HEADERS): a repeated line is appended to the
// first with ",", so a filter sees one value. Other headers stay separate
// entries.
var inlineRequestHeaders = map[string]bool{
	"x-client-trace-id": true, "x-envoy-downstream-service-cluster": true, "x-envoy-downstream-service-node": true,
	"x-envoy-external-address": true, "x-envoy-force-trace": true, "x-envoy-hedge-on-per-try-timeout": true,
	"x-envoy-internal": true, "x-envoy-ip-tags": true, "x-envoy-retry-on": true, "x-envoy-retry-grpc-on": true,
	"x-envoy-retriable-status-codes": true, "x-envoy-retriable-header-names": true, "x-envoy-original-path": true,
	"x-envoy-original-url": true, "x-envoy-upstream-alt-stat-name": true,
	"x-envoy-upstream-rq-timeout-alt-response": true, "expect": true, "x-forwarded-client-cert": true,
	"x-forwarded-for": true, "x-forwarded-host": true, "x-forwarded-proto": true, "grpc-timeout": true,
	"te": true, "user-agent": true,
	"connection": true, "content-type": true, "x-envoy-decorator-operation": true, "keep-alive": true,
	"proxy-connection": true, "proxy-status": true, "x-request-id": true, "transfer-encoding": true,
	"upgrade": true, "via": true,
}

// mergeInline joins the repeated lines of inline headers, as Envoy's header
// map does when the codec adds them.
func mergeInline(hs []wasmhost.Header) []wasmhost.Header {
	out := hs[:0]
	first := map[string]int{}
	for _, h := range hs {
		if inlineRequestHeaders[h.Name] {
			if i, ok := first[h.Name]; ok {
				out[i].Value += "," + h.Value
				continue
			}
			first[h.Name] = len(out)
		}
		out = append(out, h)
	}
	return out
}

// headersSize is the size Envoy's codec compares with
// max_request_headers_kb: every name and value.
func headersSize(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Host)
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v)
		}
	}
	return n
}

// apply runs the manager over a new stream. It returns a status other than
// 0 when Envoy would answer itself (400, 307 with location); the header
// limits (431) are codecReply's.
func (m *Manager) apply(s *request, r *http.Request) (status int, location string) {
	path, _ := s.req.Get(":path")
	p, q, hasQuery := strings.Cut(path, "?")
	action := m.EscapedSlashes
	redirect := false
	if action != "" && action != "KEEP_UNCHANGED" {
		if u, found := unescapeSlashes(p); found {
			switch action {
			case "REJECT_REQUEST":
				return http.StatusBadRequest, ""
			case "UNESCAPE_AND_REDIRECT":
				redirect = true
			}
			p = u
		}
	}
	if m.NormalizePath {
		var ok bool
		if p, ok = normalizePath(p); !ok {
			return http.StatusBadRequest, ""
		}
	}
	if m.MergeSlashes {
		p = mergeSlashes(p)
	}
	if hasQuery {
		p += "?" + q
	}
	if redirect {
		return http.StatusTemporaryRedirect, p
	}
	s.req.Replace(":path", p)

	m.clientAddress(s)
	return 0, ""
}

// clientAddress sets source.address and x-forwarded-for as the connection
// manager does.
func (m *Manager) clientAddress(s *request) {
	xff, _ := s.req.Get("x-forwarded-for")
	var final string
	if m.UseRemoteAddress {
		if m.XFFNumTrustedHops > 0 {
			final = xffFromRight(xff, m.XFFNumTrustedHops-1)
		}
		if !m.SkipXFFAppend {
			peer := hostOnly(s.remoteAddr)
			if ip := net.ParseIP(peer); ip != nil && ip.IsLoopback() && s.localAddr != "" {
				peer = hostOnly(s.localAddr)
			}
			appended := peer
			if xff != "" {
				appended = xff + "," + appended
			}
			s.req.Replace("x-forwarded-for", appended)
		}
	} else {
		final = xffFromRight(xff, m.XFFNumTrustedHops)
	}
	if final != "" {
		s.remoteAddr = net.JoinHostPort(final, "0")
	}
}

// hostOnly returns the address of "ip:port" (or addr itself without a port).
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// xffFromRight returns the entry skip places from the right of an
// x-forwarded-for value if it is an IP address (Envoy's
// getLastAddressFromXFF), else "".
func xffFromRight(xff string, skip int) string {
	if xff == "" {
		return ""
	}
	entries := strings.Split(xff, ",")
	if skip >= len(entries) {
		return ""
	}
	e := strings.TrimSpace(entries[len(entries)-1-skip])
	if ip := net.ParseIP(e); ip != nil {
		return e
	}
	return ""
}

// unescapeSlashes replaces %2F and %5C (any case) with '/' and '\'.
func unescapeSlashes(p string) (string, bool) {
	var b strings.Builder
	found := false
	for i := 0; i < len(p); i++ {
		if p[i] == '%' && i+2 < len(p) {
			switch strings.ToUpper(p[i+1 : i+3]) {
			case "2F":
				b.WriteByte('/')
				i += 2
				found = true
				continue
			case "5C":
				b.WriteByte('\\')
				i += 2
				found = true
				continue
			}
		}
		b.WriteByte(p[i])
	}
	return b.String(), found
}

// normalizePath percent-decodes unreserved characters, upper-cases the hex
// of other escapes and removes "." and ".." segments (RFC 3986 sections
// 6.2.2.2 and 5.2.4); ".." above the root stays at the root. A path that
// does not start with '/' is refused.
func normalizePath(p string) (string, bool) {
	if !strings.HasPrefix(p, "/") {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]) {
			v, _ := strconv.ParseUint(p[i+1:i+3], 16, 8)
			if d := byte(v); isUnreserved(d) {
				b.WriteByte(d)
			} else {
				b.WriteString("%" + strings.ToUpper(p[i+1:i+3]))
			}
			i += 2
			continue
		}
		b.WriteByte(c)
	}
	segs := strings.Split(b.String()[1:], "/")
	out := make([]string, 0, len(segs))
	for i, seg := range segs {
		last := i == len(segs)-1
		switch seg {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, seg)
		}
	}
	return "/" + strings.Join(out, "/"), true
}

func mergeSlashes(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '/' && i > 0 && p[i-1] == '/' {
			continue
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}
