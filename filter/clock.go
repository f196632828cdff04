//go:build !wasip1

package filter

import "time"

// wallClock is Plugin.Clock's default outside the guest: the wall clock.
// Inside the guest (clock_wasip1.go) the binding sets Clock itself, and the
// time package, with the GODEBUG machinery it links, stays out of the
// module.
func wallClock() float64 {
	return float64(time.Now().UnixNano()) / 1e9
}
