// Package redisstore is tokengate-rls's Redis store and its Lua scripts: the
// token bucket (tokenbucket.lua, with refill.lua and store.lua joined in,
// reading its key's override), calendar quotas' consumption (quota.lua),
// envoyproxy/ratelimit's fixed windows (fixedwindow.lua), lease mode
// (lease.lua), settlements after the response (settle.lua) and RLQS's
// shares (share.lua), on one Redis, a Redis Cluster or a Sentinel's master,
// with the per-node guard that keeps calls within their deadline
// (guard.go). The deciding services (internal/service/rls and rlqs) run
// it through interfaces of their own.
package redisstore
