package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/internal/service/dropin"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// TestRatelimitBadDirectoryAtStart: a runtime directory with a bad file
// stops the start by default (exit 1, the file named); with
// TOKENGATE_BAD_CONFIG_AT_START=serve the drop-in starts as
// envoyproxy/ratelimit does: healthy, every call answered with the error
// "no rate limit configuration loaded", until the directory loads.
func TestRatelimitBadDirectoryAtStart(t *testing.T) {
	redis := redistest.Start(t)
	setup := func(t *testing.T) (root, dir string) {
		root = t.TempDir()
		dir = filepath.Join(root, "rl", "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "bad.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
		return root, dir
	}
	env := func(root string, extra ...string) func(string) (string, bool) {
		return envOf(append([]string{"HOST", "127.0.0.1", "PORT", "0", "GRPC_HOST", "127.0.0.1", "GRPC_PORT", "0",
			"DEBUG_HOST", "127.0.0.1", "DEBUG_PORT", "0", "USE_STATSD", "false", "REDIS_SOCKET_TYPE", "tcp",
			"REDIS_URL", redis.Addr, "REDIS_TIMEOUT", "5s", "RUNTIME_ROOT", root, "RUNTIME_SUBDIRECTORY", "rl"}, extra...)...)
	}

	t.Run("exit", func(t *testing.T) {
		root, _ := setup(t)
		err := runRatelimit(context.Background(), env(root), io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "bad.yaml") || !strings.Contains(err.Error(), "fortnight") {
			t.Errorf("start on a bad directory: %v, want an error naming bad.yaml and the bad unit", err)
		}
	})

	t.Run("serve", func(t *testing.T) {
		root, dir := setup(t)
		logw := &lockedLog{}
		s := &service{}
		addrs := s.begin(t, func(ctx context.Context, l chan<- [2]string) error {
			return runRatelimit(ctx, env(root, "TOKENGATE_BAD_CONFIG_AT_START", "serve"), logw, l)
		})
		s.grpc = addrs[0]
		if !strings.Contains(logw.String(), "no rate limit configuration loaded") || !strings.Contains(logw.String(), "fortnight") {
			t.Errorf("the start does not log the bad directory:\n%s", logw.String())
		}
		waitFor(t, "/healthcheck 200 with Redis up", func() bool { code, _ := get(t, "http://"+addrs[1]+"/healthcheck"); return code == http.StatusOK })
		rc := rlsv3.NewRateLimitServiceClient(s.conn(t))
		call := func() (*rlsv3.RateLimitResponse, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return rc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "a", Descriptors: []*commonrl.RateLimitDescriptor{
				{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
		}
		if r, err := call(); status.Code(err) != codes.Unknown || status.Convert(err).Message() != "no rate limit configuration loaded" {
			t.Errorf("a call with no configuration: %v %v, want Unknown: no rate limit configuration loaded", r, err)
		}
		writeFile(t, filepath.Join(dir, "bad.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 0}\n")
		waitFor(t, "the fixed directory decides", func() bool {
			r, err := call()
			return err == nil && r.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
		})
	})
}

// TestRatelimitFlags: the drop-in's command line sets -drain and
// -drain-delay over their environment variables, and nothing else.
func TestRatelimitFlags(t *testing.T) {
	for _, tc := range []struct {
		name                string
		env, args           []string
		expectDrain, expect time.Duration // drain, then drain delay
		expectedErr         string
	}{
		{name: "none: the defaults", expectDrain: 5 * time.Second},
		{name: "environment", env: []string{"TOKENGATE_RLS_DRAIN", "7s", "TOKENGATE_RLS_DRAIN_DELAY", "3s"}, expectDrain: 7 * time.Second, expect: 3 * time.Second},
		{name: "flags win", env: []string{"TOKENGATE_RLS_DRAIN", "7s", "TOKENGATE_RLS_DRAIN_DELAY", "3s"}, args: []string{"-drain", "9s", "-drain-delay", "1s"},
			expectDrain: 9 * time.Second, expect: time.Second},
		{name: "drain delay 0", args: []string{"-drain-delay", "0"}, expectDrain: 5 * time.Second},
		{name: "another flag", args: []string{"-config", "x.json"}, expectedErr: "flag provided but not defined: -config"},
		{name: "an argument", args: []string{"serve"}, expectedErr: `unexpected arguments ["serve"]: started as ratelimit, tokengate-rls reads envoyproxy/ratelimit's environment (docs/dropin.md)`},
		{name: "negative delay", args: []string{"-drain-delay", "-1s"}, expectedErr: "-drain must be positive and -drain-delay not negative"},
		{name: "drain 0", args: []string{"-drain", "0"}, expectedErr: "-drain must be positive and -drain-delay not negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := dropin.ParseSettings(envOf(tc.env...))
			if err != nil {
				t.Fatal(err)
			}
			err = ratelimitFlags(tc.args, e, io.Discard)
			if tc.expectedErr != "" {
				if err == nil || err.Error() != tc.expectedErr {
					t.Errorf("got %v, want %q", err, tc.expectedErr)
				}
				return
			}
			if drain, delay := e.Drain(); err != nil || drain != tc.expectDrain || delay != tc.expect {
				t.Errorf("got %v %v %v, want %v %v", drain, delay, err, tc.expectDrain, tc.expect)
			}
		})
	}
}
