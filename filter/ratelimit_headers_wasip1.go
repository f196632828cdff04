//go:build wasip1

package filter

import "github.com/tokengate/tokengate/ratelimitheader"

// The wasm guest's hosts take the RateLimit headers one by one (see
// ratelimit_headers_native.go): constant answers the compiler folds away.

type rateLimitHeaderHost = struct{}

func findRateLimitHeaderSetter(Host) (_ rateLimitHeaderHost) { return }

func hostRateLimitHeaders(*Plugin, []ratelimitheader.Quota, int) bool { return false }
