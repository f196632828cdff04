// Package rlscontract is what the tokengate filter (the wasm guest) and
// tokengate-rls agree on when they talk over Envoy's rate-limit service
// API (envoy.service.ratelimit.v3.RateLimitService, ShouldRateLimit): the
// guest's codec of the messages, binary (wire.go) and JSON (wire_json.go);
// the descriptor entries and the call header tokengate adds to the
// protocol; and one builder and one parser for each kind of descriptor
// the filter sends (descriptor.go): a cluster-scope rule's request, a
// lease request or exact take (docs/lease.md, "Wire protocol"), and a
// settlement (docs/rls.md, "Settling after the response").
//
// Both sides import this package and neither imports the other. The guest
// links it, so it depends on the standard library and internal/guest/lite only
// and uses no fmt, log or os (docs/proxy-wasm.md); the service converts its
// protobuf messages to Entry and Descriptor at its edge.
package rlscontract
