package sharedstate

// SpinBackoff returns a Backoff for Updater that busy-waits a random number
// of loop iterations, up to 32 × 2^attempt (capped at 2^13 × 32 ≈ 0.3 ms),
// so that workers who collided on a key retry at different moments.
//
// It spins rather than sleeps: inside a proxy-wasm guest sleeping needs WASI
// poll_oneoff, which Envoy 1.33–1.38 do not implement. seed makes different
// workers choose different delays; the random source is a xorshift
// generator owned by the returned function, so use it from one goroutine.
func SpinBackoff(seed uint64) func(attempt int) {
	x := seed | 1
	// sink keeps the compiler from removing the spin loop. It belongs to
	// the returned function, like x: no state is shared between workers.
	var sink uint64
	return func(attempt int) {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		shift := min(attempt, 13)
		n := x % (32 << shift)
		acc := sink
		for i := uint64(0); i < n; i++ {
			acc = acc*6364136223846793005 + i
		}
		sink = acc
	}
}
