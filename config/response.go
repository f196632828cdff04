package config

import (
	"strconv"

	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// ResponseSettings are the options an operator of Envoy's local_ratelimit
// expects for what a limited client sees (fields of "settings").
type ResponseSettings struct {
	// RateLimitHeaders reports whether RateLimit, RateLimit-Policy and the
	// legacy RateLimit-Limit/-Remaining/-Reset are sent ("ratelimit_headers",
	// default true), like local_ratelimit's enable_x_ratelimit_headers.
	RateLimitHeaders bool
	// RuleHeaders reports whether x-tokengate-rule and x-tokengate-reason
	// are sent and the JSON body names the rule ("rule_headers", default
	// true). Turn it off to keep rule names from clients.
	RuleHeaders bool
	// RejectionStatus is the HTTP status of a rate-limited request
	// ("rejection_status", 400 to 599, default 429), like local_ratelimit's
	// status. A request costing more than its bucket can ever hold gets 413
	// whatever this says.
	RejectionStatus uint32
	// RejectionBody, when set, replaces the JSON body of a rejection
	// ("rejection_body", at most 4096 bytes), sent with
	// RejectionContentType ("rejection_content_type", default
	// "text/plain" with a body of one's own, else "application/json").
	RejectionBody        []byte
	RejectionContentType string
}

// responseSettingFields are the settings keys responseSettings reads.
var responseSettingFields = []string{"ratelimit_headers", "rule_headers", "rejection_status", "rejection_body", "rejection_content_type"}

// maxRejectionBody bounds settings.rejection_body.
const maxRejectionBody = 4096

func defaultResponseSettings() ResponseSettings {
	return ResponseSettings{RateLimitHeaders: true, RuleHeaders: true, RejectionStatus: 429, RejectionContentType: "application/json"}
}

// responseSettings reads the response options of settings v into rs.
func responseSettings(rs *ResponseSettings, v ljson.Result) error {
	for _, f := range []struct {
		name string
		dst  *bool
	}{{"ratelimit_headers", &rs.RateLimitHeaders}, {"rule_headers", &rs.RuleHeaders}} {
		if b := v.Get(f.name); b.Exists() {
			if b.Type != ljson.True && b.Type != ljson.False {
				return errAt("settings."+f.name, "must be true or false, got "+short(b.Raw))
			}
			*f.dst = b.Bool()
		}
	}
	if s := v.Get("rejection_status"); s.Exists() {
		n, ok := integer(s)
		if !ok || n < 400 || n > 599 {
			return errAt("settings.rejection_status", "must be an integer from 400 to 599, got "+short(s.Raw))
		}
		rs.RejectionStatus = uint32(n)
	}
	ct := v.Get("rejection_content_type")
	if b := v.Get("rejection_body"); b.Exists() {
		if b.Type != ljson.String || len(b.Str) > maxRejectionBody {
			return errAt("settings.rejection_body", "must be a string of at most "+strconv.Itoa(maxRejectionBody)+" bytes, got "+short(b.Raw))
		}
		rs.RejectionBody = []byte(b.Str)
		rs.RejectionContentType = "text/plain"
	}
	if ct.Exists() {
		if ct.Type != ljson.String || ct.Str == "" || len(ct.Str) > 128 || !printable(ct.Str) {
			return errAt("settings.rejection_content_type", "must be a media type of 1 to 128 printable characters, got "+short(ct.Raw))
		}
		rs.RejectionContentType = ct.Str
	}
	return nil
}

// printable reports whether s is visible ASCII or spaces.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
