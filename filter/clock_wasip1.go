//go:build wasip1

package filter

// wallClock is Plugin.Clock's default inside the guest, where the binding
// (filter/abi) always sets Clock to WASI's clock_time_get: it returns 0, a
// time every bucket update refuses, so a plugin without a clock fails open
// instead of inventing a time.
func wallClock() float64 { return 0 }
