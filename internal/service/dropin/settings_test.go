package dropin

import (
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// envOf is an environment of the given names and values.
func envOf(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestRatelimitEnvDefaults: no variables give envoyproxy/ratelimit's
// defaults, and the settings it has on by default that tokengate-rls does
// not implement (statsd) are named.
func TestRatelimitEnvDefaults(t *testing.T) {
	e, err := ParseSettings(envOf())
	if err != nil {
		t.Fatal(err)
	}
	if e.port != 8080 || e.grpcPort != 8081 || e.debugPort != 6070 || e.host != "0.0.0.0" {
		t.Errorf("ports %d %d %d host %q, want 8080 8081 6070 0.0.0.0", e.port, e.grpcPort, e.debugPort, e.host)
	}
	if e.redisSocket != "unix" || e.redisType != "SINGLE" || e.redisURL != "/var/run/nutcracker/ratelimit.sock" {
		t.Errorf("redis %s %s %s, want unix SINGLE /var/run/nutcracker/ratelimit.sock", e.redisSocket, e.redisType, e.redisURL)
	}
	if e.runtimeRoot != "/srv/runtime_data/current" || e.runtimeApp != "config" || !e.watchRoot || e.configType != "FILE" {
		t.Errorf("runtime %q %q %v %q", e.runtimeRoot, e.runtimeApp, e.watchRoot, e.configType)
	}
	if e.algorithm != rls.TokenBucket || e.headers != nil || e.redisTimeout != daemon.DefaultRedisTimeout {
		t.Errorf("algorithm %v headers %v timeout %v", e.algorithm, e.headers, e.redisTimeout)
	}
	if e.detailedMax != rls.DefaultDetailedDescriptors {
		t.Errorf("detailed metric cap %d, want %d", e.detailedMax, rls.DefaultDetailedDescriptors)
	}
	if e, err := ParseSettings(envOf("TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS", "0")); err != nil || e.detailedMax != 0 {
		t.Errorf("TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS=0: %v", err)
	}
	if len(e.notes) != 1 || !strings.HasPrefix(e.notes[0], "USE_STATSD=true (its default)") {
		t.Errorf("notes %q, want USE_STATSD's", e.notes)
	}
	e, err = ParseSettings(envOf("USE_STATSD", "false", "LIMIT_RESPONSE_HEADERS_ENABLED", "true", "LIMIT_REMAINING_HEADER", "X-Left",
		"TOKENGATE_ALGORITHM", "fixed_window", "HOST", "::", "REDIS_AUTH", "user:secret", "REDIS_TYPE", "cluster", "REDIS_URL", "a:1,b:2"))
	if err != nil {
		t.Fatal(err)
	}
	if len(e.notes) != 0 || e.headers == nil || e.headers.Remaining != "X-Left" || e.headers.Limit != "RateLimit-Limit" || e.algorithm != rls.FixedWindow || e.host != "::" {
		t.Errorf("parsed %+v", e)
	}
	o, err := e.storeOptions()
	if err != nil || !o.Cluster || len(o.Addrs) != 2 || o.Username != "user" || o.Password != "secret" {
		t.Errorf("store options %+v, %v", o, err)
	}
	e, _ = ParseSettings(envOf("REDIS_URL", "rediss://u:p@redis.example:6380/0", "REDIS_SOCKET_TYPE", "tcp"))
	if o, err := e.storeOptions(); err != nil || o.Addrs[0] != "redis.example:6380" || o.Username != "u" || o.Password != "p" || o.TLS == nil {
		t.Errorf("a rediss URL: %+v, %v", o, err)
	}
	e, _ = ParseSettings(envOf("REDIS_URL", "redis://redis.example:6379/11"))
	if _, err := e.storeOptions(); err == nil || !strings.Contains(err.Error(), "database 11") {
		t.Errorf("a URL with database 11: %v, want it refused", err)
	}
	e, _ = ParseSettings(envOf("REDIS_TYPE", "sentinel", "REDIS_URL", "mymaster,s1:26379,s2:26379", "REDIS_SENTINEL_AUTH", "spw"))
	if o, err := e.storeOptions(); err != nil || o.SentinelMaster != "mymaster" || len(o.Addrs) != 2 || o.SentinelPassword != "spw" {
		t.Errorf("sentinel: %+v, %v", o, err)
	}
}

// TestRatelimitEnvRefused: a setting that would change decisions if it
// were ignored stops the start, naming it; a bad value too.
func TestRatelimitEnvRefused(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"BACKEND_TYPE", "memcache"}, "BACKEND_TYPE=\"memcache\" is not supported"},
		{[]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"}, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"},
		{[]string{"REDIS_PERSECOND", "true"}, "REDIS_PERSECOND"},
		{[]string{"QUOTA_MODE", "true"}, "QUOTA_MODE"},
		{[]string{"MERGE_DOMAIN_CONFIG", "true"}, "MERGE_DOMAIN_CONFIG"},
		{[]string{"GRPC_UDS", "/tmp/x.sock"}, "GRPC_UDS"},
		{[]string{"TOKENGATE_ALGORITHM", "sliding"}, "TOKENGATE_ALGORITHM"},
		{[]string{"PORT", "http"}, "PORT=\"http\""},
		{[]string{"REDIS_TYPE", "ring"}, "REDIS_TYPE"},
		{[]string{"CONFIG_TYPE", "GRPC_XDS_DELTA"}, "CONFIG_TYPE"},
		{[]string{"GRPC_SERVER_USE_TLS", "true"}, "GRPC_SERVER_TLS_CERT"},
		{[]string{"REDIS_TIMEOUT", "soon"}, "REDIS_TIMEOUT"},
		{[]string{"TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS", "-1"}, "TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS"},
		{[]string{"TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS", "lots"}, "TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS"},
	} {
		_, err := ParseSettings(envOf(tc.env...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to mention %q", tc.env, err, tc.want)
		}
	}
	if _, err := ParseSettings(envOf("BACKEND_TYPE", "redis", "QUOTA_MODE", "false")); err != nil {
		t.Errorf("the defaults, given: %v", err)
	}
}

// TestRatelimitEnvTable: each environment variable read into the one
// settings value, with its default when unset.
func TestRatelimitEnvTable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    []string
		got    func(e *Settings) any
		expect any
	}{
		{"drain default", nil, func(e *Settings) any { return e.drain }, 5 * time.Second},
		{"drain", []string{"TOKENGATE_RLS_DRAIN", "30s"}, func(e *Settings) any { return e.drain }, 30 * time.Second},
		{"drain delay default: none, as envoyproxy/ratelimit", nil, func(e *Settings) any { return e.drainDelay }, time.Duration(0)},
		{"drain delay", []string{"TOKENGATE_RLS_DRAIN_DELAY", "2s"}, func(e *Settings) any { return e.drainDelay }, 2 * time.Second},
		{"drain delay 0", []string{"TOKENGATE_RLS_DRAIN_DELAY", "0s"}, func(e *Settings) any { return e.drainDelay }, time.Duration(0)},
		{"bad config at start default: exit", nil, func(e *Settings) any { return e.serveBadConfig }, false},
		{"bad config at start: serve", []string{"TOKENGATE_BAD_CONFIG_AT_START", "serve"}, func(e *Settings) any { return e.serveBadConfig }, true},
		{"bad config at start: exit", []string{"TOKENGATE_BAD_CONFIG_AT_START", "exit"}, func(e *Settings) any { return e.serveBadConfig }, false},
		{"redis timeout default", nil, func(e *Settings) any { return e.redisTimeout }, daemon.DefaultRedisTimeout},
		{"redis timeout", []string{"REDIS_TIMEOUT", "40ms"}, func(e *Settings) any { return e.redisTimeout }, 40 * time.Millisecond},
		{"algorithm", []string{"TOKENGATE_ALGORITHM", "fixed_window"}, func(e *Settings) any { return e.algorithm }, rls.FixedWindow},
		{"config type, any case", []string{"CONFIG_TYPE", "grpc_xds_sotw"}, func(e *Settings) any { return e.configType }, "GRPC_XDS_SOTW"},
		{"log level warning", []string{"LOG_LEVEL", "WARNING"}, func(e *Settings) any { return e.slogLevel() }, "warn"},
		{"healthy with config", []string{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"}, func(e *Settings) any { return e.healthyWithConfig }, true},
		{"force start", []string{"FORCE_START_WITHOUT_INITIAL_CONFIG", "true"}, func(e *Settings) any { return e.forceStart }, true},
		{"grpc port", []string{"GRPC_PORT", "9000"}, func(e *Settings) any { return e.grpcPort }, 9000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := ParseSettings(envOf(tc.env...))
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
			if _, err := ParseSettings(envOf(tc.env...)); err == nil || err.Error() != tc.expectedErr {
				t.Errorf("got %v, want %q", err, tc.expectedErr)
			}
		})
	}
}

// TestRedactURL: REDIS_URL as logs and errors show it, the password
// replaced, whatever the form.
func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"redis:6379", "redis:6379"},
		{"redis://redis:6379", "redis://redis:6379"},
		{"redis://user:pw@redis:6379/0", "redis://user:xxxxx@redis:6379/0"},
		{"rediss://:pw@redis:6379", "rediss://:xxxxx@redis:6379"},
		{"redis://user@redis:6379", "redis://user@redis:6379"},
		{"master,redis://u:pw@s1:26379,s2:26379", "master,redis://u:xxxxx@s1:26379,s2:26379"},
		{"redis://u:pw@host:port", "redis://xxxxx@host:port"},
		{"u:p@w@host:1", "xxxxx@host:1"},
	} {
		if got := RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
