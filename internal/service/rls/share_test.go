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
		res := store.Share(context.Background(), []redisstore.ShareBatch{{Key: key, Rate: 10, Burst: 100, Fill: 1, Pool: 9, BurstPool: 50,
			Grace: 1, Turn: 10, Now: now, Ops: []redisstore.ShareOp{{Holder: holder, Demand: demand, TTL: 11}}}})[0][0]
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
	// (half the pool, 4 units) and is replaced at once by one of 4 units and
	// 22 max_tokens (not retired to nothing), the 22 taken from the free
	// tokens; the old share keeps only its rate above the new one (5 units)
	// and its max_tokens for the 1 s grace.
	if a3 := share("a", 10, "1002.000000"); a3.Units != 4 || a3.MaxTokens != 22 || !a3.Changed || math.Abs(a3.Tokens-28) > 1e-6 {
		t.Fatalf("a above its target: %+v, want 4 units, 22 max_tokens, changed, 28 free tokens", a3)
	}
	// After the grace b gets its half too: the free tokens stayed at 28
	// (capped: 100 less the 50 + 22 held) until 1003, then refilled at 10/s
	// less a's 4/s for 0.5 s = 31, less b's 22.
	b := share("b", 10, "1003.500000")
	if b.Units != 4 || b.MaxTokens != 22 || !b.Changed || math.Abs(b.Tokens-9) > 1e-6 {
		t.Fatalf("b after the grace: %+v, want 4 units, 22 max_tokens, 9 free tokens", b)
	}
}
