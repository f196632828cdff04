package filter_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
)

// TestDelaySimulatedTimer drives the filter with random arrivals, clients
// that leave, and a timer that behaves like Envoy's: it fires one period
// after it was last set or last fired, and every set recreates it. A model
// of the bucket (its own arithmetic, not the filter's) gives each held
// request its deadline. Every held request must be released at or after its
// deadline and at most 2 ms after it (the tick's rounding, and a re-arm
// after a tick that came early), in
// admission order; one that left never; and the tick must be 0 whenever
// nothing waits.
func TestDelaySimulatedTimer(t *testing.T) {
	const rate, burst, reserve = 10.0, 1.0, 5.0
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		f := delayFixture(t, `,"max_pending":1000`)
		type held struct {
			s        *filter.Stream
			id       uint32
			deadline float64
			gone     bool
		}
		var (
			waiting  []*held // in admission order
			byID     = map[uint32]*held{}
			balance  = burst
			last     = epoch
			period   uint32
			armedAt  float64
			nextID   uint32
			periods  int
			released int
		)
		synced := func() { // a set recreates the timer
			if n := len(f.h.TickPeriods); n > periods {
				periods, period, armedAt = n, f.h.TickPeriods[n-1], f.now
			}
		}
		arrival := epoch + rng.Float64()*0.05
		for step := 0; step < 400; step++ {
			fire := math.Inf(1)
			if period > 0 {
				// Timers fire up to half a millisecond early against the
				// wall clock the filter reads.
				fire = armedAt + float64(period)/1000 - rng.Float64()*0.0005
			}
			if arrival <= fire {
				f.now = arrival
				arrival += rng.Float64() * 0.15
				if len(waiting) > 0 && rng.IntN(8) == 0 { // a client leaves
					w := waiting[rng.IntN(len(waiting))]
					if !w.gone {
						w.gone = true
						f.h.End(w.s, w.id)
						synced()
					}
					continue
				}
				s, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
				nextID++
				synced()
				balance = math.Min(burst, balance+(f.now-last)*rate)
				last = f.now
				fits := balance-1 >= -reserve-1e-6
				if math.Abs(balance-1+reserve) < 1e-6 {
					fits = res.Status() != 429 // on the edge: rounding decides
				}
				switch {
				case !fits:
					if res.Status() != 429 {
						t.Fatalf("seed %d: request %d admitted at balance %v, want a 429", seed, nextID, balance)
					}
				case balance-1 >= -1e-6 && res.RequestAction == filter.Continue:
					balance--
				case res.RequestAction == filter.Pause && res.Local == nil:
					balance--
					h := &held{s: s, id: nextID, deadline: f.now + -balance/rate}
					waiting = append(waiting, h)
					byID[nextID] = h
				default:
					t.Fatalf("seed %d: request %d at balance %v: action %v, status %d", seed, nextID, balance, res.RequestAction, res.Status())
				}
				continue
			}
			f.now = fire
			armedAt = fire
			got := f.h.Tick(f.p)
			synced()
			for _, id := range got {
				h := byID[id]
				switch {
				case h == nil || h.gone:
					t.Fatalf("seed %d: tick continued stream %d, which is not held", seed, id)
				case f.now < h.deadline-1e-6 || f.now > h.deadline+0.0021:
					t.Fatalf("seed %d: stream %d released at %+.6f, deadline %+.6f", seed, id, f.now-epoch, h.deadline-epoch)
				}
				for len(waiting) > 0 && waiting[0].gone {
					waiting = waiting[1:]
				}
				if waiting[0] != h {
					t.Fatalf("seed %d: released stream %d before %d", seed, id, waiting[0].id)
				}
				waiting = waiting[1:]
				delete(byID, id)
				released++
			}
			for len(waiting) > 0 && waiting[0].gone {
				waiting = waiting[1:]
			}
			if (f.p.Waiting() == 0) != (period == 0) {
				t.Fatalf("seed %d: %d waiting with tick period %d", seed, f.p.Waiting(), period)
			}
		}
		if released < 20 {
			t.Errorf("seed %d: only %d released: the simulation did not exercise holds", seed, released)
		}
	}
}
