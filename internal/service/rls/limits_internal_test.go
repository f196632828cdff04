package rls

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestAdmissionHammer: P goroutines × N acquisitions of 1 to 4 against a
// bound of 10: what is admitted at once never passes the bound (the
// counter itself may, for an instant, while a refused acquisition takes
// its weight back), and everything is released at the end.
func TestAdmissionHammer(t *testing.T) {
	const p, n, bound = 8, 5000, 10
	var a admission
	var over, refused, admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range p {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				w := int64((g+i)%4 + 1)
				if !a.acquire(w, bound) {
					refused.Add(1)
					continue
				}
				if admitted.Add(w) > bound {
					over.Add(1)
				}
				admitted.Add(-w)
				a.release(w)
			}
		}()
	}
	wg.Wait()
	if over.Load() != 0 {
		t.Errorf("held past the bound %d times", over.Load())
	}
	if got := a.held.Load(); got != 0 {
		t.Errorf("held at the end: got %d, want 0", got)
	}
	t.Logf("refused %d of %d", refused.Load(), p*n)
}
