package wasmhost

import (
	"sync"
	"time"
)

// FakeClock is a manual clock for Options.Walltime and Options.Nanotime:
// the guest's time.Now() reads it through WASI clock_time_get, and it moves
// only when Advance or Set is called, so tests step time without sleeping.
// It is safe for concurrent use.
//
// Example:
//
//	clk := host.NewFakeClock(time.Unix(1_700_000_000, 0))
//	h, err := host.New(ctx, host.Options{Wasm: wasm, Walltime: clk.Walltime, Nanotime: clk.Nanotime})
//	...
//	clk.Advance(500 * time.Millisecond) // the next request sees +0.5 s
type FakeClock struct {
	mu   sync.Mutex
	wall int64 // nanoseconds since the Unix epoch
	mono int64 // starts at 1 (the Go runtime throws if nanotime is 0); only ever increases
}

// NewFakeClock returns a clock that reads start until it is moved.
func NewFakeClock(start time.Time) *FakeClock {
	return &FakeClock{wall: start.UnixNano(), mono: 1}
}

// Now returns the clock's current wall time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Unix(0, c.wall)
}

// Advance moves the clock by d. A negative d moves the wall clock back,
// like an NTP step; Nanotime never decreases.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.step(int64(d))
}

// Set moves the wall clock to t (see Advance for a backwards move).
func (c *FakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.step(t.UnixNano() - c.wall)
}

func (c *FakeClock) step(d int64) {
	c.wall += d
	if d > 0 {
		c.mono += d
	}
}

// Walltime implements wazero's sys.Walltime: seconds and nanoseconds since
// the Unix epoch.
func (c *FakeClock) Walltime() (sec int64, nsec int32) {
	c.mu.Lock()
	ns := c.wall
	c.mu.Unlock()
	sec, rem := ns/1e9, ns%1e9
	if rem < 0 {
		sec, rem = sec-1, rem+1e9
	}
	return sec, int32(rem)
}

// Nanotime implements wazero's sys.Nanotime: 1 plus the nanoseconds the
// clock moved forward since it was created (never 0, which the Go runtime
// rejects).
func (c *FakeClock) Nanotime() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}
