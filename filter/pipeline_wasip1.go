//go:build wasip1

package filter

// fastPaths: the wasm guest takes none of the native shortcuts (see
// pipeline_native.go).
const fastPaths = false
