package redisstore_test

import (
	"context"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// TestAdminCalls: with the Redis user docs/rls.md documents, the admin
// API's calls work: SetOverride replaces the hash wholly and sets or
// clears its expiry, ReadHashes reads hashes and their expiry in one
// round trip (an absent key: no field, no expiry), ReadString reads a
// bucket, DeleteOverride says whether there was one.
func TestAdminCalls(t *testing.T) {
	srv := redistest.Start(t, append([]string{"--user"}, documentedACL(t, "pw", false)...)...)
	store, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr}, Timeout: time.Second, Username: "tokengate", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	ov := redisstore.OverrideKey("api", "acme")
	if err := eventually(func() error {
		return store.SetOverride(ctx, ov, []redisstore.Field{{Name: "rate", Value: 2.5}, {Name: "burst", Value: 1e12}}, time.Minute)
	}); err != nil {
		t.Fatalf("SetOverride: %v", err)
	}
	hs, err := store.ReadHashes(ctx, ov, redisstore.QuotaKey("api", "acme", 0))
	if err != nil {
		t.Fatalf("ReadHashes: %v", err)
	}
	if want := map[string]string{"rate": "2.5", "burst": "1e+12"}; !reflect.DeepEqual(hs[0].Fields, want) {
		t.Errorf("override: got %v, want %v", hs[0].Fields, want)
	}
	if hs[0].TTL <= 0 || hs[0].TTL > time.Minute {
		t.Errorf("override TTL: got %v, want in (0, 1m]", hs[0].TTL)
	}
	if len(hs[1].Fields) != 0 || hs[1].TTL >= 0 {
		t.Errorf("absent key: got %+v, want no field and a negative TTL", hs[1])
	}
	if err := store.SetOverride(ctx, ov, []redisstore.Field{{Name: "limit", Value: 7}}, 0); err != nil {
		t.Fatal(err)
	}
	if hs, err = store.ReadHashes(ctx, ov); err != nil || !reflect.DeepEqual(hs[0].Fields, map[string]string{"limit": "7"}) || hs[0].TTL >= 0 {
		t.Errorf("after a replacement without expiry: %+v %v, want only limit 7 and no expiry", hs, err)
	}
	tb := redisstore.BucketKey("api", "acme")
	if _, found, err := store.ReadString(ctx, tb); err != nil || found {
		t.Errorf("ReadString of an absent bucket: found %v, %v", found, err)
	}
	if err := store.Run(ctx, []redisstore.Op{{Key: tb, Rate: 1, Burst: 5, Cost: 1}})[0].Err; err != nil {
		t.Fatal(err)
	}
	if v, found, err := store.ReadString(ctx, tb); err != nil || !found || len(v) < len("4.000000:") || v[:9] != "4.000000:" {
		t.Errorf("ReadString of a bucket: %q %v %v, want 4 tokens", v, found, err)
	}
	for i, want := range []bool{true, false} {
		if existed, err := store.DeleteOverride(ctx, ov); err != nil || existed != want {
			t.Errorf("DeleteOverride #%d: %v %v, want %v", i+1, existed, err, want)
		}
	}
}

// TestSetOverrideHammer: writers replace one override with field sets of
// different shapes while a reader reads it; every read sees exactly one
// writer's whole set, never a mixture or an empty hash (SetOverride's DEL
// and HSET run as one script).
func TestSetOverrideHammer(t *testing.T) {
	srv := redistest.Start(t)
	store, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	key := redisstore.OverrideKey("api", "hammer")
	sets := [][]redisstore.Field{
		{{Name: "rate", Value: 1}, {Name: "burst", Value: 10}},
		{{Name: "burst", Value: 20}},
		{{Name: "limit", Value: 30}},
	}
	if err := eventually(func() error { return store.SetOverride(ctx, key, sets[0], 0) }); err != nil {
		t.Fatal(err)
	}
	want := make([]map[string]string, len(sets))
	for i, s := range sets {
		want[i] = map[string]string{}
		for _, f := range s {
			want[i][f.Name] = strconv.FormatFloat(f.Value, 'g', -1, 64)
		}
	}
	const writers, loops = 4, 100
	done := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := range loops {
				if err := store.SetOverride(ctx, key, sets[(w+i)%len(sets)], 0); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	reads, running := 0, writers
	for running > 0 {
		select {
		case err := <-done:
			running--
			if err != nil {
				t.Fatalf("SetOverride: %v", err)
			}
			continue
		default:
		}
		hs, err := store.ReadHashes(ctx, key)
		if err != nil {
			t.Fatalf("ReadHashes: %v", err)
		}
		reads++
		whole := false
		for _, w := range want {
			whole = whole || reflect.DeepEqual(hs[0].Fields, w)
		}
		if !whole {
			t.Fatalf("read %d: %v, not one writer's whole set", reads, hs[0].Fields)
		}
	}
	t.Logf("%d reads during %d writes", reads, writers*loops)
}
