// Command tokengate is the proxy-wasm module. Build it as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o build/tokengate.wasm ./cmd/tokengate
//
// Everything happens in the exported callbacks of filter/abi; main is never
// called.
package main

import _ "github.com/tokengate/tokengate/filter/abi"

func main() {}
