package filter

// RetryAfter is retryAfterHash for an identity string, for the tests.
func RetryAfter(wait float64, identity string) int64 {
	return retryAfterHash(wait, fnv64(identity))
}
