package main

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// adminHandler serves the admin endpoints of a running host. /shared_data
// hides identities and the slot seed unless showIdentities.
func adminHandler(h *wasmhost.Host, showIdentities bool) http.Handler {
	var hmacKey [32]byte
	_, _ = rand.Read(hmacKey[:])
	mux := http.NewServeMux()
	stats := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_ = proxy.WritePrometheus(w, h.Metrics())
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
		entries := ms.Snapshot("")
		if !showIdentities {
			entries = redactEntries(entries, hmacKey[:])
			_, _ = io.WriteString(w, "# identities and the slot seed redacted (tokengate-local -show-identities shows them)\n")
		}
		_ = writeSharedData(w, entries, ms.Bytes())
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

// seedKey is the shared-data key of the filter's slot seed, the secret that
// keeps a client from choosing an identity whose slots are another's
// (docs/configuration.md). The local host shares no code with the module,
// so the name is written out here.
const seedKey = "tokengate:seed"

// redactEntries returns entries with what identifies a client replaced by
// "#" and 12 hex digits of an HMAC under key (random per process, so that
// lines can be matched within one run but a value cannot be guessed back
// from its digest): the identity part of every "{kind}:{rule}:{identity}"
// key ("tb:", "shadow:tb:", "tl:", "cc:"; a slot number, "$7", is no
// identity), a slot value's owner ("{tokens}:{last_refill}:{owner}"), and
// the slot seed's value.
func redactEntries(entries []wasmhost.Entry, key []byte) []wasmhost.Entry {
	digest := func(s string) string {
		m := hmac.New(sha256.New, key)
		m.Write([]byte(s))
		return "#" + hex.EncodeToString(m.Sum(nil)[:6])
	}
	out := make([]wasmhost.Entry, len(entries))
	for i, e := range entries {
		if e.Key == seedKey {
			e.Value = "(redacted)"
			out[i] = e
			continue
		}
		shadow, rest := "", e.Key
		if strings.HasPrefix(rest, "shadow:") {
			shadow, rest = "shadow:", rest[len("shadow:"):]
		}
		kind, rest, ok1 := strings.Cut(rest, ":")
		rule, id, ok2 := strings.Cut(rest, ":")
		if ok1 && ok2 && id != "" && id[0] != '$' {
			e.Key = shadow + kind + ":" + rule + ":" + digest(id)
		}
		if kind == "tb" {
			// {tokens}:{last_refill}:{owner}; the owner may hold ':'.
			if f := strings.SplitN(e.Value, ":", 3); len(f) == 3 && f[2] != "" {
				e.Value = f[0] + ":" + f[1] + ":" + digest(f[2])
			}
		}
		out[i] = e
	}
	return out
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
