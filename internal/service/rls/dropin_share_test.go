package rls

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// shareTree is envoyproxy/ratelimit's test/config/share_threshold.yaml
// (the fixture of its TestShareThreshold), plus its integration runtime's
// files_no_share and a pattern reached across the '_' of a composite key.
func shareTree() []*Domain {
	lim := func(n uint32) *RateLimit {
		return &RateLimit{RequestsPerUnit: n, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}
	}
	return []*Domain{{Name: "test-domain", Descriptors: []*Descriptor{
		{Key: "files", Value: "files/*", ShareThreshold: true, RateLimit: lim(100)},
		{Key: "nested", Value: "parent", Descriptors: []*Descriptor{
			{Key: "files", Value: "nested/*", ShareThreshold: true, RateLimit: lim(200)},
		}},
		{Key: "files", Value: "top/*", ShareThreshold: true, Descriptors: []*Descriptor{
			{Key: "files", Value: "nested/*", ShareThreshold: true, RateLimit: lim(300)},
		}},
		{Key: "route", Value: "api/*", ShareThreshold: true, Descriptors: []*Descriptor{
			{Key: "method", RateLimit: lim(60)},
		}},
		{Key: "service", Value: "svc/*", ShareThreshold: true, Descriptors: []*Descriptor{
			{Key: "endpoint", RateLimit: &RateLimit{RequestsPerUnit: 80, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, DetailedMetric: true}},
		}},
		{Key: "path", Value: "path/*", ShareThreshold: true, Descriptors: []*Descriptor{
			{Key: "file", Value: "file/*", Descriptors: []*Descriptor{
				{Key: "type", RateLimit: lim(120)},
			}},
		}},
		{Key: "user", Value: "user/*", ShareThreshold: true, Descriptors: []*Descriptor{
			{Key: "resource", Value: "res/*", ShareThreshold: true, Descriptors: []*Descriptor{
				{Key: "action", RateLimit: lim(150)},
			}},
		}},
		{Key: "file", Value: "test1", RateLimit: lim(50)},
		{Key: "file", Value: "test*", ShareThreshold: true, RateLimit: lim(100)},
		{Key: "files_no_share", Value: "files_no_share/*", RateLimit: lim(10)},
		{Key: "a", Value: "b*", ShareThreshold: true, RateLimit: lim(7)},
	}}}
}

// TestDropinShareThreshold: a share_threshold node keys the limit reached
// through it by its pattern, exactly as envoyproxy/ratelimit's GetLimit
// and GenerateCacheKey do (ShareThresholdKeyPattern): the window counter
// of every value the pattern matches is one key,
// "<prefix><domain>_files_files/*_<start>", at every level where a share
// node matched as a pattern; an exact match, a node without
// share_threshold and an entry matched by its key alone keep the value.
// The cases and keys are those of that project's TestShareThreshold (its
// stats keys name the same patterns) and its cache-key test.
func TestDropinShareThreshold(t *testing.T) {
	cfg, err := NewDropinConfig(shareTree(), DropinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		entries []string // key, value, ...
		limit   uint32   // 0: none
		window  string   // windowKey with prefix "p:" and start 60
		detail  string   // the detailed series' name, when it has one
	}{
		{"basic", []string{"files", "files/a.pdf"}, 100, "p:test-domain_files_files/*_60", ""},
		{"basic, another value", []string{"files", "files/b.csv"}, 100, "p:test-domain_files_files/*_60", ""},
		{"nested", []string{"nested", "parent", "files", "nested/file1.txt"}, 200, "p:test-domain_nested_parent_files_nested/*_60", ""},
		{"two levels share", []string{"files", "top/file1.txt", "files", "nested/file1.txt"}, 300, "p:test-domain_files_top/*_files_nested/*_60", ""},
		{"a share node without rate_limit", []string{"route", "api/v1", "method", "GET"}, 60, "p:test-domain_route_api/*_method_GET_60", ""},
		{"detailed", []string{"service", "svc/user", "endpoint", "get"}, 80, "p:test-domain_service_svc/*_endpoint_get_60", "test-domain.service_svc/*.endpoint_get"},
		{"parent shares, child does not", []string{"path", "path/foo", "file", "file/doc1", "type", "pdf"}, 120, "p:test-domain_path_path/*_file_file/doc1_type_pdf_60", ""},
		{"both share", []string{"user", "user/alice", "resource", "res/file1", "action", "read"}, 150, "p:test-domain_user_user/*_resource_res/*_action_read_60", ""},
		{"an exact value before the pattern", []string{"file", "test1"}, 50, "p:test-domain_file_test1_60", ""},
		{"the pattern beside an exact value", []string{"file", "test2"}, 100, "p:test-domain_file_test*_60", ""},
		{"the pattern, a third value", []string{"file", "test123"}, 100, "p:test-domain_file_test*_60", ""},
		{"no share_threshold: a counter per value", []string{"files_no_share", "files_no_share/x"}, 10, "p:test-domain_files_no_share_files_no_share/x_60", ""},
		// The node {a, b*} matched by the entry {a_b, x} through the
		// composite "a_b_x": the pattern "a_b*" without "a_b_" in front
		// is itself (upstream trims the entry's key and '_').
		{"across the composite's '_'", []string{"a_b", "x"}, 7, "p:test-domain_a_b_a_b*_60", ""},
		{"the pattern, matched by the key and value apart", []string{"a", "bq"}, 7, "p:test-domain_a_b*_60", ""},
		{"no match", []string{"files", "other"}, 0, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var es []Entry
			for i := 0; i+1 < len(tt.entries); i += 2 {
				es = append(es, Entry{Key: tt.entries[i], Value: tt.entries[i+1]})
			}
			orig := append([]Entry(nil), es...)
			l, keyed := cfg.dropin.resolve("test-domain", es)
			for i := range es {
				if es[i] != orig[i] {
					t.Fatalf("resolve changed the request's entries: %v, was %v", es, orig)
				}
			}
			if l == nil {
				if tt.limit != 0 {
					t.Fatalf("no limit, want %d", tt.limit)
				}
				return
			}
			if l.RequestsPerUnit != tt.limit {
				t.Fatalf("limit %d, want %d", l.RequestsPerUnit, tt.limit)
			}
			if got := windowKey("p:", "test-domain", keyed, 60); got != tt.window {
				t.Errorf("window key %q, want %q", got, tt.window)
			}
			if tt.detail != "" {
				if got := sharedDetailedName("test-domain", es, keyed); got != tt.detail {
					t.Errorf("detailed name %q, want %q", got, tt.detail)
				}
			}
		})
	}
}

// TestDropinShareThresholdNeedsPattern: share_threshold on a node whose
// key and value hold no '*' is refused, as envoyproxy/ratelimit refuses it
// ("share_threshold can only be used with wildcard values").
func TestDropinShareThresholdNeedsPattern(t *testing.T) {
	_, err := NewDropinConfig([]*Domain{{Name: "d", Descriptors: []*Descriptor{
		{Key: "files", Value: "files/a", ShareThreshold: true},
	}}}, DropinOptions{})
	if err == nil || err.Error() != "d.files_files/a: share_threshold: the key or value must hold a '*'" {
		t.Fatalf("got %v", err)
	}
}

// TestDropinShareThresholdDecisions runs share_threshold on a real Redis
// in both algorithms: 10 per hour shared by every value of files/* (ten
// calls with ten values pass, the eleventh value is over), while
// files_no_share/* keeps a limit per value (each value's first call
// passes with 9 remaining). These are the calls of envoyproxy/ratelimit's
// integration test TestShareThreshold. With token buckets the shared
// bucket is one Redis key.
func TestDropinShareThresholdDecisions(t *testing.T) {
	redis := redistest.Start(t)
	st, err := redisstore.New(redisstore.Options{Addrs: []string{redis.Addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	deadline := time.Now().Add(10 * time.Second)
	for st.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("redis does not answer")
		}
		time.Sleep(20 * time.Millisecond)
	}
	domains := []*Domain{{Name: "share-threshold-test", Descriptors: []*Descriptor{
		{Key: "files", Value: "files/*", ShareThreshold: true, RateLimit: &RateLimit{RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR}},
		{Key: "files_no_share", Value: "files_no_share/*", RateLimit: &RateLimit{RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR}},
	}}}
	ask := func(t *testing.T, s *Server, key, value string) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		r, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "share-threshold-test",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Statuses[0]
	}
	for _, alg := range []struct {
		name string
		alg  Algorithm
		key  string // the Redis key shared by files/*; "%d" the window start
	}{
		{"fixed window", FixedWindow, "share-threshold-test_files_files/*_%d"},
		{"token bucket", TokenBucket, "tb:{rl:share-threshold-test|10/3600|files|files/*}"},
	} {
		t.Run(alg.name, func(t *testing.T) {
			for attempt := 0; ; attempt++ {
				if attempt == 3 {
					t.Fatal("three hour edges in a row")
				}
				redis.MustDo("FLUSHALL")
				hour := time.Now().Unix() / 3600
				cfg, err := NewDropinConfig(domains, DropinOptions{Algorithm: alg.alg})
				if err != nil {
					t.Fatal(err)
				}
				s := NewServer(cfg, st, NewMetrics(cfg))
				var codes []string
				for i := range 10 {
					st := ask(t, s, "files", "files/"+strconv.Itoa(i)+".pdf")
					codes = append(codes, st.Code.String()+"/"+strconv.Itoa(int(st.LimitRemaining)))
				}
				last := ask(t, s, "files", "files/b.csv")
				codes = append(codes, last.Code.String()+"/"+strconv.Itoa(int(last.LimitRemaining)))
				var unshared []string
				for i := range 10 {
					st := ask(t, s, "files_no_share", "files_no_share/"+strconv.Itoa(i))
					unshared = append(unshared, st.Code.String()+"/"+strconv.Itoa(int(st.LimitRemaining)))
				}
				keys, _ := redis.Do("KEYS", "*")
				if time.Now().Unix()/3600 != hour {
					continue
				}
				want := "OK/9 OK/8 OK/7 OK/6 OK/5 OK/4 OK/3 OK/2 OK/1 OK/0 OVER_LIMIT/0"
				if got := strings.Join(codes, " "); got != want {
					t.Errorf("files/*: %s\nwant      %s", got, want)
				}
				if got, want := strings.Join(unshared, " "), strings.TrimSpace(strings.Repeat("OK/9 ", 10)); got != want {
					t.Errorf("files_no_share/*: %s\nwant %s", got, want)
				}
				shared := strings.ReplaceAll(alg.key, "%d", strconv.FormatInt(hour*3600, 10))
				ks, _ := keys.([]any)
				found, n := false, 0
				for _, k := range ks {
					s, _ := k.(string)
					found = found || s == shared
					if strings.Contains(s, "|files|") || strings.Contains(s, "_files_files/") {
						n++
					}
				}
				if !found || n != 1 {
					t.Errorf("Redis keys %v: want files/* in the one key %s", ks, shared)
				}
				return
			}
		})
	}
}
