// Package bench holds tokengate's end-to-end benchmarks of the built module
// (build/tokengate.wasm, or $TOKENGATE_WASM) in the local wazero host,
// without HTTP, and the scripts that run the rest of the suite: run.sh
// (`make bench`) and report/ (which prints the one table). See
// BENCHMARKS.md at the repository root for what every figure means.
//
// The benchmarks are testing.B functions: `make test` only checks that they
// compile and run one iteration; none asserts a time.
package bench
