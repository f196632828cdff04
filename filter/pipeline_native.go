//go:build !wasip1

package filter

// fastPaths is whether the request path takes the shortcuts that cost the
// wasm guest module bytes for little gain there: natively, yes. The guest
// (pipeline_wasip1.go) folds them away. Each shortcut must be what the
// general code would do, and is tested against it:
//   - OnRequestHeaders runs a local-only request's local and hold stages
//     directly, outside the stage loop (TestLocalOnlySkipsNoWork);
//   - initRequest resets only what a lookup reads before writing it
//     (request.forget, TestRequestForget) instead of zeroing the request.
const fastPaths = true
