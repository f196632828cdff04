// Package main is the Envoy dynamic module's c-shared entry point; it needs
// cgo (see main.go), and holds nothing else without it.
package main
