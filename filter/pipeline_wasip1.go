//go:build wasip1

package filter

// directLocal: the wasm guest runs the stage loop for every request (see
// pipeline_native.go).
const directLocal = false
