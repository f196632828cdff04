// Package deploy holds no code of its own: its tests check, by machine, the
// deployment artifacts that nothing here can run.
//
//   - envoy.yaml is parsed into go-control-plane's bootstrap/v3 Bootstrap,
//     validated with Envoy's own generated rules (ValidateAll) down through
//     every typed_config, and its wasm filter's plugin configuration is fed
//     through config.Parse; mutated copies (a field-name typo, a wrong
//     @type, an invalid rule, ...) must fail.
//
//   - deploy/istio/wasmplugin.yaml is parsed into Istio's WasmPlugin API
//     type and its pluginConfig must parse and equal envoy.yaml's
//     configuration.
//
//   - config.schema.json is compiled as JSON Schema draft 2020-12; every
//     example configuration in the repository must pass both the schema and
//     the parser, and a sample of invalid ones must fail both.
//
//   - the Helm chart of tokengate-rls (deploy/helm/tokengate-rls) is
//     rendered with Helm's packages for several sets of values and every
//     object decoded strictly into its k8s.io/api type (helm_test.go);
//
//   - deploy/istio/rls (DestinationRule, EnvoyFilter, WasmPlugin) is decoded
//     with istio.io/api types and checked against the rendered chart.
//
// The OCI image writer for Istio's Wasm image format lives in
// deploy/wasmimage, with its command in deploy/cmd/wasm-oci; the image of
// tokengate-rls in deploy/rlsimage, with deploy/cmd/rls-image.
package deploy
