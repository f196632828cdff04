//go:build !wasip1

package filter

// directLocal is whether OnRequestHeaders runs a local-only request's
// local and hold stages directly, outside the stage loop: natively, yes.
// The wasm guest, where every call site costs module bytes, runs the loop
// for every request (pipeline_wasip1.go).
const directLocal = true
