//go:build !wasip1

package config

import (
	"strconv"

	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// quotaDetails reads the fields of a quota that only the rate-limit
// service uses (time_zone, billing_day, thresholds) into q, strictly.
// The wasm guest, which forwards the quota and never computes a period,
// skips them (quota_guest.go): its size budget has no room for their
// checks, and tokengate-rls, tokengate-local -check and the filter's
// native tests refuse a bad value with the messages below. The zone is
// checked here for its length only: tokengate-rls checks it against its
// zone database.
func quotaDetails(path string, v ljson.Result, q *Quota) error {
	if z := v.Get("time_zone"); z.Exists() {
		if z.Type != ljson.String || z.Str == "" || len(z.Str) > maxZoneLen {
			return errAt(path+".time_zone", `must be an IANA time zone name of 1 to 64 bytes, such as "Europe/Paris", got `+short(z.Raw))
		}
		q.TimeZone = z.Str
	}
	if b := v.Get("billing_day"); b.Exists() {
		n, ok := integer(b)
		if !ok || n < 1 || n > 31 {
			return errAt(path+".billing_day", "must be an integer from 1 to 31, got "+short(b.Raw))
		}
		if q.Period != QuotaMonth {
			return errAt(path+".billing_day", `applies only to "period": "month"`)
		}
		q.BillingDay = int(n)
	}
	t := v.Get("thresholds")
	if !t.Exists() {
		return nil
	}
	if !t.IsArray() || len(t.Array()) > maxThresholds {
		return errAt(path+".thresholds", "must be an array of at most "+strconv.Itoa(maxThresholds)+" numbers, got "+short(t.Raw))
	}
	for i, e := range t.Array() {
		at := path + ".thresholds[" + strconv.Itoa(i) + "]"
		f, err := positive(at, e, 1)
		if err != nil {
			return err
		}
		if f == 1 || i > 0 && f <= q.Thresholds[i-1] {
			return errAt(at, "must be below 1 and above the one before, got "+num(f))
		}
		q.Thresholds = append(q.Thresholds, f)
	}
	return nil
}
