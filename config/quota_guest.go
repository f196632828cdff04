//go:build wasip1

package config

import "github.com/tokengate/tokengate/internal/guest/lite/ljson"

// quotaDetails, in the wasm guest, leaves the fields of a quota that only
// the rate-limit service uses (time_zone, billing_day, thresholds)
// unread: the filter forwards a quota and never computes its period, and
// the module's size budget has no room for their checks. Their names are
// still checked (quotaFields); tokengate-rls and tokengate-local -check
// refuse a bad value (quota_service.go).
func quotaDetails(string, ljson.Result, *Quota) error { return nil }
