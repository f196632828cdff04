package rls_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// TestShareDebits drives internal/service/redisstore/share.lua at fixed instants: a share's max_tokens
// leave the free tokens before it is granted, a renewal takes nothing, the
// free tokens refill at the rule's rate less the shares' rates, and the
// free tokens plus the live shares' max_tokens never exceed the burst.
// (The RLQS fleet tests hold the bound end to end; the refill cap can hide
// a missing debit there, not here.)
func TestShareDebits(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 5*time.Second)
	key := redisstore.ShareKey("r", "k")
	// Rate 10/s, burst 100, fill 1 s: pool 9 units, burst pool 50.
	share := func(holder string, demand float64, now string) redisstore.ShareResult {
		t.Helper()
		res := store.Share(context.Background(), []redisstore.ShareOp{{Key: key, Rate: 10, Burst: 100, Fill: 1, Pool: 9, BurstPool: 50,
			Holder: holder, Demand: demand, TTL: 11, Grace: 1, Now: now}})[0]
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		return res
	}
	a := share("a", 10, "1000.000000")
	if a.Units != 9 || a.MaxTokens != 50 || !a.Changed || a.Tokens != 50 {
		t.Fatalf("first share %+v, want 9 units, 50 max_tokens, changed, 50 tokens left of 100", a)
	}
	// One second later a renews the same share: nothing is taken, and the
	// free tokens, which refill at the rule's 10/s less the share's 9/s,
	// stay at 50: with a's 50 max_tokens they are the burst.
	a2 := share("a", 10, "1001.000000")
	if a2.Changed || a2.Units != 9 || a2.MaxTokens != 50 || math.Abs(a2.Tokens-50) > 1e-6 {
		t.Fatalf("renewal %+v, want the same share and 50 free tokens", a2)
	}
	// b asks: a holds the whole pool, so b gets nothing yet, and nothing is
	// taken.
	if b := share("b", 10, "1001.000000"); b.Units != 0 || math.Abs(b.Tokens-50) > 1e-6 {
		t.Fatalf("b beside a full pool: %+v, want no share and 50 free tokens", b)
	}
	// a reports again with b's demand known: its share is above its target
	// (half the pool) and is retired, held for the 1 s grace, so that no new
	// one fits yet.
	if a3 := share("a", 10, "1002.000000"); a3.Units != 0 || math.Abs(a3.Tokens-50) > 1e-6 {
		t.Fatalf("a above its target: %+v, want its share retired and 50 free tokens", a3)
	}
	// After the grace, b gets half the pools, its max_tokens taken from the
	// free tokens: 50 while a's share is held (to 1003), then +10/s for
	// 0.5 s = 55, less 25.
	b := share("b", 10, "1003.500000")
	if b.Units != 4 || b.MaxTokens != 25 || !b.Changed || math.Abs(b.Tokens-30) > 1e-6 {
		t.Fatalf("b after the grace: %+v, want 4 units, 25 max_tokens, 30 free tokens", b)
	}
}
