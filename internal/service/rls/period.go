package rls

import (
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/config"
)

// Period returns the calendar period of q that holds now, [start, end), in
// loc (the quota's time_zone, LoadLocation'd): the hour, the day, the ISO
// week from Monday 00:00, or the month from 00:00 on its first day or, with
// a billing day, on that day (a month with fewer days starts on its last
// day). Days and weeks follow the zone's wall clock, so a day with a
// daylight-saving change lasts 23 or 25 hours.
func Period(q *config.Quota, loc *time.Location, now time.Time) (start, end time.Time) {
	t := now.In(loc)
	y, m, d := t.Date()
	switch q.Period {
	case config.QuotaHour:
		// The wall clock's hour, however far the zone is from UTC: the
		// minutes and seconds since it began, taken from the instant (a
		// time.Date of that hour is ambiguous in a repeated hour).
		start = t.Add(-time.Duration(t.Minute())*time.Minute - time.Duration(t.Second())*time.Second - time.Duration(t.Nanosecond()))
		return start, start.Add(time.Hour)
	case config.QuotaDay:
		return time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	case config.QuotaWeek:
		monday := d - (int(t.Weekday())+6)%7
		return time.Date(y, m, monday, 0, 0, 0, 0, loc), time.Date(y, m, monday+7, 0, 0, 0, 0, loc)
	}
	day := max(q.BillingDay, 1)
	start = monthStart(y, m, day, loc)
	if t.Before(start) {
		return monthStart(y, m-1, day, loc), start
	}
	return start, monthStart(y, m+1, day, loc)
}

// monthStart is 00:00 on day of month m of year y in loc, or on the
// month's last day when it has fewer days; m may be out of 1..12 (it is
// normalised, as time.Date does).
func monthStart(y int, m time.Month, day int, loc *time.Location) time.Time {
	first := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
	last := first.AddDate(0, 1, -1).Day()
	return time.Date(first.Year(), first.Month(), min(day, last), 0, 0, 0, 0, loc)
}

// periodUnits are Envoy's unit for each quota period (the status's
// current_limit: the quota per unit).
var periodUnits = [...]rlsv3.RateLimitResponse_RateLimit_Unit{
	config.QuotaHour:  rlsv3.RateLimitResponse_RateLimit_HOUR,
	config.QuotaDay:   rlsv3.RateLimitResponse_RateLimit_DAY,
	config.QuotaWeek:  rlsv3.RateLimitResponse_RateLimit_WEEK,
	config.QuotaMonth: rlsv3.RateLimitResponse_RateLimit_MONTH,
}
