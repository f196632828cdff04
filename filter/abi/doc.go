// Package abi binds the filter to the proxy-wasm ABI 0.2.1: it exports the
// proxy_on_* callbacks with //go:wasmexport, imports the host functions
// with //go:wasmimport, keeps the table of root and HTTP contexts, and
// implements filter.Host over the imports. It is the only package linked
// into the module that uses unsafe (filter/filtertest, the test host, uses
// it too, for the same string views), and its bindings only build for
// GOOS=wasip1; natively only the context table remains.
//
// Every export recovers from panics and fails open: a panic that reached
// the host would trap the VM and take down every request on that worker.
//
// Memory the host returns (header values, shared data, properties, the
// configuration) is allocated through the exported malloc /
// proxy_on_memory_allocate, from a static arena reused by every callback
// (heap buffers, kept reachable, for what does not fit): a returned value
// stays valid until the callback that read it returns, and the request path
// allocates nothing for it. See memory.go.
package abi
