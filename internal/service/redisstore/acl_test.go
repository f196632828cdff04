package redisstore_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// DocumentedACL returns the ACL rules docs/rls.md gives for the service's
// Redis user, with password pw: "tokengate", "on", ">pw", "~tb:*", ...;
// without the Cluster commands when cluster is false (a single Redis has
// no CLUSTER command to allow).
func documentedACL(t *testing.T, pw string, cluster bool) []string {
	t.Helper()
	doc, err := os.ReadFile("../../../docs/rls.md")
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile("user tokengate on >… ([^`\n]+)").FindStringSubmatch(string(doc))
	if line == nil {
		t.Fatal("docs/rls.md: no line `user tokengate on >… ...`")
	}
	out := []string{"tokengate", "on", ">" + pw}
	for _, r := range strings.Fields(line[1]) {
		if !cluster && strings.HasPrefix(r, "+cluster|") {
			continue
		}
		out = append(out, r)
	}
	return out
}

// without returns rules less drop.
func without(rules []string, drop string) []string {
	var out []string
	for _, r := range rules {
		if r != drop {
			out = append(out, r)
		}
	}
	return out
}

// eventually retries f for up to 5 s (the store connects in the
// background) and returns its last error.
func eventually(f func() error) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readyStore opens a store with opt, closed when tb ends, and waits until
// it answers Ping.
func readyStore(tb testing.TB, opt redisstore.Options) *redisstore.Store {
	tb.Helper()
	store, err := redisstore.New(opt)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(store.Close)
	if err := eventually(func() error { return store.Ping(context.Background()) }); err != nil {
		tb.Fatal(err)
	}
	return store
}

// TestDocumentedACL: with the Redis user docs/rls.md documents, every
// kind of call the service makes succeeds (a token bucket, a settlement,
// a lease, an RLQS share, a fixed window under the documented prefix)
// and Ping, the readiness check, passes. With the ACL the docs gave
// before (no "tq:*", issue 30): every share failed with NOPERM while
// Ping passed; now Ping fails, naming the command and the key.
func TestDocumentedACL(t *testing.T) {
	acl := documentedACL(t, "pw", false)
	// The drop-in's fixed windows under CACHE_KEY_PREFIX "rl_".
	acl = append(acl, "~rl_*", "+incrby", "+expire")
	srv := redistest.Start(t, append([]string{"--user"}, acl...)...)
	store, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr}, Timeout: time.Second, Username: "tokengate", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	tb := redisstore.BucketKey("api", "acme")
	calls := []struct {
		name string
		call func() error
	}{
		{"token bucket", func() error { return store.Run(ctx, []redisstore.Op{{Key: tb, Rate: 1, Burst: 5, Cost: 1}})[0].Err }},
		{"settlement", func() error {
			return store.Settle(ctx, []redisstore.SettleOp{{Key: tb, Rate: 1, Burst: 5, MaxDebt: 1e12, Kind: rlscontract.SettleRefund, Amount: 1}})[0].Err
		}},
		{"reset", func() error {
			return store.Settle(ctx, []redisstore.SettleOp{{Key: tb, Rate: 1, Burst: 5, Kind: rlscontract.SettleReset}})[0].Err
		}},
		{"lease", func() error {
			_, err := store.Lease(ctx, redisstore.LeaseOp{Key: redisstore.LeaseKey("api", "acme"), Rate: 1, Burst: 5, TTL: 10, Holder: "h", Want: 2})
			return err
		}},
		{"exact take of a lease bucket", func() error {
			return store.Run(ctx, []redisstore.Op{{Key: redisstore.LeaseKey("api", "acme"), Rate: 1, Burst: 5, Cost: 1, Lease: true, TTL: 10}})[0].Err
		}},
		{"RLQS share", func() error {
			return store.Share(ctx, []redisstore.ShareBatch{{Key: redisstore.ShareKey("api", "acme"), Rate: 1, Burst: 5, Fill: 1, Pool: 1, BurstPool: 5, Grace: 1,
				Ops: []redisstore.ShareOp{{Holder: "e1", Demand: 1, TTL: 2}}}})[0][0].Err
		}},
		{"fixed window", func() error {
			return store.Run(ctx, []redisstore.Op{{Key: "rl_a_k_v_0", Cost: 1, Window: 60, Count: 10}})[0].Err
		}},
		{"token bucket with its override", func() error {
			return store.Run(ctx, []redisstore.Op{{Key: tb, Rate: 1, Burst: 5, Cost: 1, Override: true}})[0].Err
		}},
		{"quota", func() error {
			return store.Run(ctx, []redisstore.Op{{Key: redisstore.QuotaKey("api", "acme", 0), Cost: 1,
				Quota: &redisstore.QuotaOp{Override: redisstore.OverrideKey("api", "acme"), Limit: 5, TTL: 60, Thresholds: []float64{0.5}}}})[0].Err
		}},
		{"quota reset", func() error {
			return store.Run(ctx, []redisstore.Op{{Key: redisstore.QuotaKey("api", "acme", 0), Cost: 1,
				Quota: &redisstore.QuotaOp{Override: redisstore.OverrideKey("api", "acme"), Limit: 5, TTL: 60, Mode: redisstore.QuotaReset}}})[0].Err
		}},
		{"token bucket, with a receipt", func() error {
			return store.Run(ctx, []redisstore.Op{{Key: tb, Rate: 1, Burst: 5, Cost: 1, MaxDebt: 1e12, Receipt: redisstore.ReceiptKey(tb, "0123456789abcdef")}})[0].Err
		}},
		{"settlement, with a receipt", func() error {
			return store.Settle(ctx, []redisstore.SettleOp{{Key: tb, Rate: 1, Burst: 5, MaxDebt: 1e12, Kind: rlscontract.SettleRefund, Amount: 1, Receipt: redisstore.ReceiptKey(tb, "0123456789abcdef")}})[0].Err
		}},
		{"token bucket with its override and a receipt", func() error {
			return store.Run(ctx, []redisstore.Op{{Key: tb, Rate: 1, Burst: 5, Cost: 1, MaxDebt: 1e12, Override: true, Receipt: redisstore.ReceiptKey(tb, "0123456789abcdef")}})[0].Err
		}},
		{"quota, with a receipt", func() error {
			qk := redisstore.QuotaKey("api", "acme", 0)
			return store.Run(ctx, []redisstore.Op{{Key: qk, Cost: 1, Receipt: redisstore.ReceiptKey(qk, "0123456789abcdef"),
				Quota: &redisstore.QuotaOp{Override: redisstore.OverrideKey("api", "acme"), Limit: 5, TTL: 60}}})[0].Err
		}},
		{"quota refund, with a receipt", func() error {
			qk := redisstore.QuotaKey("api", "acme", 0)
			return store.Settle(ctx, []redisstore.SettleOp{{Key: qk, Burst: 5, Kind: rlscontract.SettleRefund, Amount: 1, Receipt: redisstore.ReceiptKey(qk, "0123456789abcdef"),
				Quota: &redisstore.QuotaOp{Override: redisstore.OverrideKey("api", "acme"), Limit: 5, TTL: 60}}})[0].Err
		}},
		{"quota reset, with a receipt", func() error {
			qk := redisstore.QuotaKey("api", "acme", 0)
			return store.Settle(ctx, []redisstore.SettleOp{{Key: qk, Burst: 5, Kind: rlscontract.SettleReset, Receipt: redisstore.ReceiptKey(qk, "0123456789abcdef"),
				Quota: &redisstore.QuotaOp{Override: redisstore.OverrideKey("api", "acme"), Limit: 5, TTL: 60}}})[0].Err
		}},
	}
	for _, c := range calls {
		if err := eventually(c.call); err != nil {
			t.Errorf("documented ACL: %s: %v", c.name, err)
		}
	}
	if err := eventually(func() error { return store.Ping(ctx) }); err != nil {
		t.Errorf("documented ACL: Ping: %v, want nil", err)
	}

	// The ACL before: no RLQS keys.
	srv.MustDo(append([]string{"ACL", "SETUSER"}, without(acl, "~tq:*")...)...)
	srv.MustDo("ACL", "SETUSER", "tokengate", "resetkeys", "~tb:*", "~tl:*", "~rl_*")
	if err := calls[5].call(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("without ~tq:*: a share: %v, want NOPERM", err)
	}
	err = store.Ping(ctx)
	if !errors.Is(err, redisstore.ErrPermission) || !strings.Contains(err.Error(), `"tq:{`) || !strings.Contains(err.Error(), "RLQS share") {
		t.Errorf("without ~tq:*: Ping: %v, want ErrPermission naming the tq: key and the RLQS share", err)
	}
	// Given back: ready again at the next check.
	srv.MustDo("ACL", "SETUSER", "tokengate", "~tq:*")
	if err := store.Ping(ctx); err != nil {
		t.Errorf("~tq:* given back: Ping: %v, want nil", err)
	}

	// A call the standing check does not cover (a fixed window, whose
	// keys the store cannot guess): its NOPERM makes Ping fail until a
	// check of its key passes.
	srv.MustDo("ACL", "SETUSER", "tokengate", "-incrby")
	if err := calls[6].call(); err == nil {
		t.Fatal("without +incrby: a fixed window succeeded")
	}
	err = store.Ping(ctx)
	if !errors.Is(err, redisstore.ErrPermission) || !strings.Contains(err.Error(), `INCRBY on key "rl_a_k_v_0" (fixed window)`) {
		t.Errorf("after a fixed window's NOPERM: Ping: %v, want ErrPermission naming INCRBY on its key", err)
	}
	srv.MustDo("ACL", "SETUSER", "tokengate", "+incrby")
	if err := store.Ping(ctx); err != nil {
		t.Errorf("+incrby given back: Ping: %v, want nil", err)
	}

	// The ACL before quotas (no qt: or ov: keys): a quota's NOPERM makes
	// Ping fail, naming its key, until the keys are given.
	srv.MustDo("ACL", "SETUSER", "tokengate", "resetkeys", "~tb:*", "~tl:*", "~tq:*", "~rl_*")
	if err := calls[8].call(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("without ~qt:* ~ov:*: a quota: %v, want NOPERM", err)
	}
	err = store.Ping(ctx)
	if !errors.Is(err, redisstore.ErrPermission) || !strings.Contains(err.Error(), `"qt:{api:acme}:0" (quota)`) {
		t.Errorf("without ~qt:*: Ping: %v, want ErrPermission naming the quota's key", err)
	}
	srv.MustDo("ACL", "SETUSER", "tokengate", "~qt:*", "~ov:*")
	if err := store.Ping(ctx); err != nil {
		t.Errorf("~qt:* ~ov:* given back: Ping: %v, want nil", err)
	}
}

// TestDocumentedACLCluster: on a Redis Cluster the check runs on every
// master, with the Cluster commands: the documented user (with them) is
// ready, one without the RLQS keys on one master only is not, the error
// naming them.
func TestDocumentedACLCluster(t *testing.T) {
	acl := documentedACL(t, "pw", true)
	c := redistest.StartCluster(t, 3, append([]string{"--user"}, acl...)...)
	store, err := redisstore.New(redisstore.Options{Addrs: c.Addrs(), Cluster: true, Timeout: time.Second, Username: "tokengate", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	if err := eventually(func() error { return store.Ping(ctx) }); err != nil {
		t.Fatalf("documented ACL with the Cluster commands: Ping: %v, want nil", err)
	}
	share := []redisstore.ShareBatch{{Key: redisstore.ShareKey("api", "acme"), Rate: 1, Burst: 5, Fill: 1, Pool: 1, BurstPool: 5, Grace: 1,
		Ops: []redisstore.ShareOp{{Holder: "e1", Demand: 1, TTL: 2}}}}
	if err := store.Share(ctx, share)[0][0].Err; err != nil {
		t.Errorf("a share: %v", err)
	}
	c.Nodes[1].MustDo("ACL", "SETUSER", "tokengate", "resetkeys", "~tb:*", "~tl:*")
	// Noticed at the next periodic check (10 s), or at once by a call
	// refused: a share of a bucket on that master.
	for i := 0; ; i++ {
		if i == 1000 {
			t.Fatal("no bucket on master 1 among 1000")
		}
		share[0].Key = redisstore.ShareKey("api", strconv.Itoa(i))
		if c.NodeFor(share[0].Key) == 1 {
			break
		}
	}
	if err := store.Share(ctx, share)[0][0].Err; err == nil {
		t.Fatal("a share on the master without ~tq:*: no error")
	}
	err = store.Ping(ctx)
	if !errors.Is(err, redisstore.ErrPermission) || !strings.Contains(err.Error(), `"tq:{`) {
		t.Errorf("one master without ~tq:*: Ping: %v, want ErrPermission naming the tq: key", err)
	}
	c.Nodes[1].MustDo("ACL", "SETUSER", "tokengate", "~tq:*")
	if err := store.Ping(ctx); err != nil {
		t.Errorf("~tq:* given back: Ping: %v, want nil", err)
	}
}
