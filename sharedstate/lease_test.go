package sharedstate_test

import (
	"sync"
	"testing"

	"github.com/tokengate/tokengate/sharedstate"
)

func TestLeaseRecordRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   sharedstate.LeaseRecord
		want string
	}{
		{"empty", sharedstate.LeaseRecord{}, "0.000000:0.000000:0:0.000000:0.000000:0.000000:0:0.000000:0.000000:0.000000:0.000000:0.000000:0.000000:0.000000:0"},
		{"full", sharedstate.LeaseRecord{Tokens: 12.5, Expiry: 1736940002.25, Grant: 42, Used: 3, Since: 1736940000.5,
			Claim: 1736940001.125, Claimer: 4294967295, Retry: 1736940003, Down: 1736940004.5, Hold: 1736940000.59, Ramp: 16, RTT: 0.0015,
			Wait: 2.5, Taken: 1.5, TakenSeq: 4294967294},
			"12.500000:1736940002.250000:42:3.000000:1736940000.500000:1736940001.125000:4294967295:1736940003.000000:1736940004.500000:1736940000.590000:16.000000:0.001500:2.500000:1.500000:4294967294"},
		{"negative tokens become 0", sharedstate.LeaseRecord{Tokens: -1}, "0.000000:0.000000:0:0.000000:0.000000:0.000000:0:0.000000:0.000000:0.000000:0.000000:0.000000:0.000000:0.000000:0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := sharedstate.AppendLeaseRecord(nil, tc.in)
			if string(b) != tc.want {
				t.Fatalf("got %q, want %q", b, tc.want)
			}
			got, err := sharedstate.ParseLeaseRecord(b)
			if err != nil {
				t.Fatal(err)
			}
			if string(sharedstate.AppendLeaseRecord(nil, got)) != tc.want {
				t.Errorf("round trip: got %+v", got)
			}
		})
	}
	for _, bad := range []string{"", "1:2:3:4:5:6:7:8:9:10:11:12:13:14", "1:2:3:4:5:6:7:8:9:10:11:12:13:14:15:16", "x:2:3:4:5:6:7:8:9:10:11:12:13:14:15",
		"1:2:-3:4:5:6:7:8:9:10:11:12:13:14:15", "1:2:3:4:5:6:4294967296:8:9:10:11:12:13:14:15", "1:2:3.5:4:5:6:7:8:9:10:11:12:13:14:15",
		"1:2:3:4:5:6:7:8:9:10:x:12:13:14:15", "1:2:3:4:5:6:7:8:9:10:11:12:13:14:4294967296", "1:2:3:4:5:6:7:8:9:10:11:12:13:14:1.5",
		// The record before Wait, Taken and TakenSeq: read as empty, which
		// only loses tokens.
		"1:2:3:4:5:6:7:8:9:10:11:12"} {
		if _, err := sharedstate.ParseLeaseRecord([]byte(bad)); err == nil {
			t.Errorf("ParseLeaseRecord(%q) = nil error", bad)
		}
	}
}

// TestLeaseUpdaterHammer debits one allowance from many goroutines (workers
// of one process) under Envoy's and Kong's CAS rules: exactly the tokens
// held are spent, never more.
func TestLeaseUpdaterHammer(t *testing.T) {
	for _, sem := range []sharedstate.Semantics{sharedstate.Envoy, sharedstate.Kong} {
		t.Run(sem.String(), func(t *testing.T) {
			st := sharedstate.NewMemStore(sem)
			const key, held, workers, tries = "tl:r:k", 500, 8, 200
			seed := sharedstate.LeaseUpdater{Store: st}
			if _, _, err := seed.Update(key, func(r *sharedstate.LeaseRecord) bool { r.Tokens, r.Expiry = held, 100; return true }); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			admitted := 0
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					u := sharedstate.LeaseUpdater{Store: st, MaxAttempts: 1000, Backoff: sharedstate.SpinBackoff(uint64(w) + 1)}
					for i := 0; i < tries; i++ {
						ok := false
						_, wrote, err := u.Update(key, func(r *sharedstate.LeaseRecord) bool {
							ok = r.Spendable(50) >= 1
							if ok {
								r.Tokens--
								r.Used++
							}
							return ok
						})
						if err != nil {
							t.Error(err)
							return
						}
						if ok && wrote {
							mu.Lock()
							admitted++
							mu.Unlock()
						}
					}
				}(w)
			}
			wg.Wait()
			if admitted != held {
				t.Errorf("admitted %d, want exactly %d", admitted, held)
			}
			v, _, _ := st.Get(key)
			r, _ := sharedstate.ParseLeaseRecord(v)
			if r.Tokens != 0 || r.Used != held {
				t.Errorf("record %+v, want 0 tokens and %d used", r, held)
			}
		})
	}
}
