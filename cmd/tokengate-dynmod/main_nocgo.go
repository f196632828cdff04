//go:build !cgo

// Package main is the Envoy dynamic module's c-shared entry point. It needs
// cgo (main.go); without it, it builds to nothing useful, so that
// `go build ./...` and vet pass where cgo is off (GOOS=wasip1,
// CGO_ENABLED=0).
package main

func main() {}
