module github.com/tokengate/tokengate

go 1.24.0

require (
	github.com/tetratelabs/proxy-wasm-go-sdk v0.24.0
	github.com/tetratelabs/wazero v1.11.0
	github.com/tidwall/gjson v1.18.0
	golang.org/x/time v0.12.0
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/kr/pretty v0.3.1 // indirect
	github.com/rogpeppe/go-internal v1.12.0 // indirect
	github.com/stretchr/testify v1.11.1 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/sys v0.39.0 // indirect
	gopkg.in/check.v1 v1.0.0-20201130134442-10cb98267c6c // indirect
)
