package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/wasmhost"
)

// adminHandler serves the admin endpoints of a running host.
func adminHandler(h *wasmhost.Host) http.Handler {
	mux := http.NewServeMux()
	stats := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_ = wasmhost.WritePrometheus(w, h.Metrics())
	}
	mux.HandleFunc("GET /stats", stats)
	mux.HandleFunc("GET /stats/prometheus", stats)
	mux.HandleFunc("GET /shared_data", func(w http.ResponseWriter, _ *http.Request) {
		ms, ok := wasmhost.Unwrap(h.Store())
		if !ok {
			http.Error(w, "the store cannot be listed", http.StatusNotImplemented)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_ = writeSharedData(w, ms.Snapshot(""), ms.Bytes())
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "LIVE\n")
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "tokengate-local admin: /stats /stats/prometheus /shared_data /ready\n")
	})
	return mux
}

// writeSharedData writes one line per key: the key, its cas and its value,
// quoted as Go strings so binary values stay on one line.
func writeSharedData(w io.Writer, entries []wasmhost.Entry, bytes int) error {
	if _, err := fmt.Fprintf(w, "# %d keys, %d bytes of keys and values\n", len(entries), bytes); err != nil {
		return err
	}
	for _, e := range entries {
		if _, err := fmt.Fprintf(w, "%s cas=%d value=%s\n", strconv.Quote(e.Key), e.CAS, strconv.Quote(e.Value)); err != nil {
			return err
		}
	}
	return nil
}

// ruleNames lists the rule names in a plugin configuration, whichever
// layout it uses: policies[].spec.rules[].name, rules[].name, or a single
// top-level name.
// ruleNames returns the names of the configuration's rules, fallback
// limits included, as the filter itself parses them.
func ruleNames(cfg []byte) ([]string, error) {
	c, err := config.Parse(cfg)
	if err != nil {
		return nil, errors.New("(invalid configuration: " + err.Error() + ")")
	}
	var names []string
	for _, r := range c.Rules() {
		names = append(names, r.Name)
	}
	return names, nil
}
