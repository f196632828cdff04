package dropin

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// TestRuntimeHalfWrittenFile: a file of the runtime directory rewritten
// in place in two halves, a poll falling between them, is never
// installed half: calls that run throughout are each decided by the old
// or the new whole configuration, and the limit on "k" (in both, last in
// the new file, so absent from its first half) never disappears; the new
// file is in force two polls after it is complete. Before (issue 30), the
// poll between the halves installed the first half, which parses: "k"
// unlimited until the next write was seen.
func TestRuntimeHalfWrittenFile(t *testing.T) {
	redis := redistest.Start(t)
	store, err := redisstore.New(redisstore.Options{Addrs: []string{redis.Addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	root := t.TempDir()
	dir := filepath.Join(root, "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "a.yaml")
	const old = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 0}\n"
	// The new file: "n" limited (the sign it is in force), fillers, then
	// "k" as before.
	var b strings.Builder
	b.WriteString("domain: a\ndescriptors:\n  - key: n\n    rate_limit: {unit: hour, requests_per_unit: 0}\n")
	for i := range 40 {
		b.WriteString("  - key: filler" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + "\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	}
	b.WriteString("  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 0}\n")
	whole := b.String()
	// The first half ends at a line's end: it parses, without "k".
	half := whole[:strings.LastIndex(whole[:len(whole)/2], "\n")+1]
	if err := os.WriteFile(file, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}

	r := &Runtime{Root: root, Dir: dir, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cfg, err := r.First()
	if err != nil {
		t.Fatal(err)
	}
	srv := rls.NewServer(cfg, store, rls.NewMetrics(cfg))
	var applied atomic.Int32
	apply := func(c *rls.Config, err error) {
		if err != nil {
			t.Errorf("a reload failed: %v", err)
			return
		}
		applied.Add(1)
		srv.SetConfig(c)
	}
	if _, err := r.Follow(context.Background(), apply); err != nil {
		t.Fatal(err)
	}
	decide := func(key string) rlsv3.RateLimitResponse_Code {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := srv.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "a", Descriptors: []*commonrl.RateLimitDescriptor{
			{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: key, Value: "v"}}}}})
		if err != nil {
			t.Errorf("a call on %q: %v", key, err)
			return rlsv3.RateLimitResponse_UNKNOWN
		}
		return resp.GetOverallCode()
	}

	// Calls on "k" throughout, each of which must be limited.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls, unlimited atomic.Int32
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 10000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			calls.Add(1)
			if decide("k") != rlsv3.RateLimitResponse_OVER_LIMIT {
				unlimited.Add(1)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	waitCalls := func(n int32) {
		t.Helper()
		target := calls.Load() + n
		for deadline := time.Now().Add(10 * time.Second); calls.Load() < target; {
			if time.Now().After(deadline) {
				t.Fatalf("fewer than %d calls in 10 s", n)
			}
			time.Sleep(time.Millisecond)
		}
	}

	f, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(half); err != nil {
		t.Fatal(err)
	}
	r.Poll(apply) // a poll between the halves
	waitCalls(20)
	if _, err := f.WriteString(whole[len(half):]); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	r.Poll(apply) // sees the whole file for the first time
	waitCalls(20)
	r.Poll(apply) // the same again: complete, loaded
	waitCalls(20)
	close(stop)
	wg.Wait()

	if n := unlimited.Load(); n > 0 {
		t.Errorf("%d of %d calls on k were not limited: a half-written file was in force", n, calls.Load())
	}
	if got := decide("n"); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("after two polls of the whole file: n is %v, want OVER_LIMIT (the new file in force)", got)
	}
	if got := applied.Load(); got != 1 {
		t.Errorf("%d configurations applied, want 1 (the whole new file)", got)
	}
}
