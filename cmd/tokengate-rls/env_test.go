package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnv: every flag can come from the environment, TOKENGATE_RLS_ and
// its name in upper case with underscores; the command line wins.
func TestEnv(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, configJSON)
	t.Setenv("TOKENGATE_RLS_CONFIG", cfg)
	t.Setenv("TOKENGATE_RLS_REDIS", "127.0.0.1:1")
	t.Setenv("TOKENGATE_RLS_LISTEN", "127.0.0.1:0")
	t.Setenv("TOKENGATE_RLS_ADMIN", "127.0.0.1:0")
	t.Setenv("TOKENGATE_RLS_STREAM_WORKERS", "70000") // the command line's 8 wins
	t.Setenv("TOKENGATE_RLS_LOG_FORMAT", "json")
	var logs syncBuffer
	_, admin := startRun(t, &logs, "-stream-workers", "8")
	if code, _ := get(t, admin+"/live"); code != http.StatusOK {
		t.Errorf("/live: %d", code)
	}
	if !strings.Contains(logs.String(), `"msg":"serving"`) {
		t.Errorf("TOKENGATE_RLS_LOG_FORMAT=json not applied:\n%s", logs.String())
	}

	t.Setenv("TOKENGATE_RLS_REDIS_TIMEOUT", "soon")
	err := run(context.Background(), nil, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "TOKENGATE_RLS_REDIS_TIMEOUT") {
		t.Errorf("a bad environment value: %v, want an error naming the variable", err)
	}
}

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{"redis-timeout": "TOKENGATE_RLS_REDIS_TIMEOUT", "config": "TOKENGATE_RLS_CONFIG",
		"tls-client-ca": "TOKENGATE_RLS_TLS_CLIENT_CA"} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q, want %q", flag, got, want)
		}
	}
}
