package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
)

// Echo is the JSON body EchoHandler answers with.
type Echo struct {
	Method  string              `json:"method"`
	Path    string              `json:"path"`
	Host    string              `json:"host"`
	Headers map[string][]string `json:"headers"`
}

// EchoHandler returns the default upstream: it answers every request with
// 200 and an Echo of it as JSON (header names lower-case).
func EchoHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e := Echo{Method: r.Method, Path: r.URL.RequestURI(), Host: r.Host, Headers: make(map[string][]string)}
		names := make([]string, 0, len(r.Header))
		for k := range r.Header {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			e.Headers[strings.ToLower(k)] = r.Header[k]
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(e)
	})
}

// ProxyTo returns an upstream that forwards to target with
// httputil.ReverseProxy, keeping the request's :authority as the Host
// header (Envoy does not rewrite it by default) and its Accept-Encoding
// (none added, the answer not decompressed).
func ProxyTo(target *url.URL) http.Handler {
	// Envoy passes Accept-Encoding as the client sent it and the body as
	// the upstream sent it. Go's transport would ask for gzip when the
	// client did not, and hand back the body decompressed.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableCompression = true
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
		},
		Transport: tr,
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.RequestURI = ""
		rp.ServeHTTP(w, r)
	})
}
