package proxy

import (
	"net/http"
	"sort"
	"strings"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// Response trailers
//
// When the upstream sends trailers, Envoy ends the response with them
// rather than with the body: the body's last proxy_on_response_body has
// end_of_stream 0 and proxy_on_response_trailers(num_trailers) follows,
// with the trailers readable and writable as RESPONSE_TRAILERS (map type
// 3) during that callback and proxy_on_log. The local host does the same,
// streamed or buffered, and sends the trailers (as the filter left them)
// to the client after the body.
//
// An upstream handler sends trailers the way net/http does: names declared
// in the "Trailer" header before WriteHeader and set in the header map
// after the body, or set after the body under http.TrailerPrefix
// (httputil.ReverseProxy does both).

// declaredTrailers returns the trailer names a handler declared in the
// "Trailer" header, canonicalised.
func declaredTrailers(h http.Header) []string {
	var names []string
	for _, v := range h.Values("Trailer") {
		for _, n := range strings.Split(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, http.CanonicalHeaderKey(n))
			}
		}
	}
	return names
}

// trailersOf returns the trailers a handler set in h after its body, with
// lower-case names in sorted order: the values of the declared names and
// every http.TrailerPrefix key.
func trailersOf(h http.Header, declared []string) []wasmhost.Header {
	seen := map[string]bool{}
	var names []string
	for _, n := range declared {
		if _, ok := h[n]; ok && !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var out []wasmhost.Header
	for _, k := range names {
		name := strings.ToLower(strings.TrimPrefix(k, http.TrailerPrefix))
		if name == "" || isHopByHop(name) {
			continue
		}
		for _, v := range h[k] {
			out = append(out, wasmhost.Header{Name: name, Value: v})
		}
	}
	return out
}

// writeTrailers sends trailers to the client after the body (chunked
// encoding on HTTP/1.1, a HEADERS frame on HTTP/2).
func writeTrailers(rw http.ResponseWriter, ts []wasmhost.Header) {
	out := rw.Header()
	for _, t := range ts {
		k := http.TrailerPrefix + t.Name
		out[k] = append(out[k], t.Value)
	}
}
