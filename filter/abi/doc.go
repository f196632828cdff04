// Package abi binds the filter to the proxy-wasm ABI 0.2.1: it exports the
// proxy_on_* callbacks with //go:wasmexport, imports the host functions
// with //go:wasmimport, keeps the table of root and HTTP contexts, and
// implements filter.Host over the imports. It is the only package that uses
// unsafe, and it only builds for GOOS=wasip1; natively the package is empty.
//
// Every export recovers from panics and fails open: a panic that reached
// the host would trap the VM and take down every request on that worker.
//
// Memory the host returns (header values, shared data, properties, the
// configuration) is allocated through the exported malloc /
// proxy_on_memory_allocate, which keeps a reference to each buffer until the
// import that asked for it has returned, so the garbage collector cannot free
// it in between.
package abi
