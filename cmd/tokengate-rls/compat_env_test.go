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

	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// TestRatelimitEnvTable: each environment variable read into the one
// settings value, with its default when unset.
func TestRatelimitEnvTable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    []string
		got    func(e *ratelimitEnv) any
		expect any
	}{
		{"drain default", nil, func(e *ratelimitEnv) any { return e.drain }, 5 * time.Second},
		{"drain", []string{"TOKENGATE_RLS_DRAIN", "30s"}, func(e *ratelimitEnv) any { return e.drain }, 30 * time.Second},
		{"drain delay default: none, as envoyproxy/ratelimit", nil, func(e *ratelimitEnv) any { return e.drainDelay }, time.Duration(0)},
		{"drain delay", []string{"TOKENGATE_RLS_DRAIN_DELAY", "2s"}, func(e *ratelimitEnv) any { return e.drainDelay }, 2 * time.Second},
		{"drain delay 0", []string{"TOKENGATE_RLS_DRAIN_DELAY", "0s"}, func(e *ratelimitEnv) any { return e.drainDelay }, time.Duration(0)},
		{"bad config at start default: exit", nil, func(e *ratelimitEnv) any { return e.serveBadConfig }, false},
		{"bad config at start: serve", []string{"TOKENGATE_BAD_CONFIG_AT_START", "serve"}, func(e *ratelimitEnv) any { return e.serveBadConfig }, true},
		{"bad config at start: exit", []string{"TOKENGATE_BAD_CONFIG_AT_START", "exit"}, func(e *ratelimitEnv) any { return e.serveBadConfig }, false},
		{"redis timeout default", nil, func(e *ratelimitEnv) any { return e.redisTimeout }, defaultRedisTimeout},
		{"redis timeout", []string{"REDIS_TIMEOUT", "40ms"}, func(e *ratelimitEnv) any { return e.redisTimeout }, 40 * time.Millisecond},
		{"algorithm", []string{"TOKENGATE_ALGORITHM", "fixed_window"}, func(e *ratelimitEnv) any { return e.algorithm }, rls.FixedWindow},
		{"config type, any case", []string{"CONFIG_TYPE", "grpc_xds_sotw"}, func(e *ratelimitEnv) any { return e.configType }, "GRPC_XDS_SOTW"},
		{"log level warning", []string{"LOG_LEVEL", "WARNING"}, func(e *ratelimitEnv) any { return e.slogLevel() }, "warn"},
		{"healthy with config", []string{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"}, func(e *ratelimitEnv) any { return e.healthyWithConfig }, true},
		{"force start", []string{"FORCE_START_WITHOUT_INITIAL_CONFIG", "true"}, func(e *ratelimitEnv) any { return e.forceStart }, true},
		{"grpc port", []string{"GRPC_PORT", "9000"}, func(e *ratelimitEnv) any { return e.grpcPort }, 9000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := parseRatelimitEnv(envOf(tc.env...))
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.got(e); got != tc.expect {
				t.Errorf("got %v, want %v", got, tc.expect)
			}
		})
	}
}

// TestRatelimitEnvTableRefused: the new settings' bad values, each with
// its exact message.
func TestRatelimitEnvTableRefused(t *testing.T) {
	for _, tc := range []struct {
		name        string
		env         []string
		expectedErr string
	}{
		{"negative drain delay", []string{"TOKENGATE_RLS_DRAIN_DELAY", "-1s"}, `TOKENGATE_RLS_DRAIN_DELAY="-1s": want a positive duration such as 5s`},
		{"drain 0", []string{"TOKENGATE_RLS_DRAIN", "0"}, `TOKENGATE_RLS_DRAIN="0": want a positive duration such as 5s`},
		{"drain not a duration", []string{"TOKENGATE_RLS_DRAIN", "soon"}, `TOKENGATE_RLS_DRAIN="soon": want a positive duration such as 5s`},
		{"bad config at start", []string{"TOKENGATE_BAD_CONFIG_AT_START", "crash"}, `TOKENGATE_BAD_CONFIG_AT_START="crash": want exit or serve`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseRatelimitEnv(envOf(tc.env...)); err == nil || err.Error() != tc.expectedErr {
				t.Errorf("got %v, want %q", err, tc.expectedErr)
			}
		})
	}
}

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
