// Package deploy holds no code of its own: its tests check, by machine, the
// deployment artifacts that nothing here can run.
//
//   - envoy.yaml is parsed into go-control-plane's bootstrap/v3 Bootstrap,
//     validated with Envoy's own generated rules (ValidateAll) down through
//     every typed_config, and its wasm filter's plugin configuration is fed
//     through config.Parse; mutated copies (a field-name typo, a wrong
//     @type, an invalid rule, ...) must fail.
//   - deploy/istio/wasmplugin.yaml is parsed into Istio's WasmPlugin API
//     type and its pluginConfig must parse and equal envoy.yaml's
//     configuration.
//   - config.schema.json is compiled as JSON Schema draft 2020-12; every
//     example configuration in the repository must pass both the schema and
//     the parser, and a sample of invalid ones must fail both.
//
// The OCI image writer for Istio's Wasm image format lives in
// deploy/wasmimage, with its command in deploy/cmd/wasm-oci.
package deploy
