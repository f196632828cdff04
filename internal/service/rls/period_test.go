package rls_test

import (
	"testing"
	"time"
	// The zones the tests name, whatever the machine has installed (the
	// service binary embeds them too).
	_ "time/tzdata"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// TestPeriod walks the periods of each kind at fixed instants: zones far
// from UTC and with half-hour offsets, days of 23 and 25 hours, ISO weeks
// across year ends, billing days beyond a month's last day, leap years.
func TestPeriod(t *testing.T) {
	const layout = "2006-01-02 15:04 MST"
	tests := []struct {
		name       string
		period     int
		billingDay int
		zone       string
		now        string // RFC 3339
		wantStart  string // in the zone, layout
		wantEnd    string
		wantHours  float64
	}{
		{"hour UTC", config.QuotaHour, 0, "UTC", "2026-05-04T10:59:59.999Z", "2026-05-04 10:00 UTC", "2026-05-04 11:00 UTC", 1},
		{"hour at a half-hour offset", config.QuotaHour, 0, "Asia/Kolkata", "2026-05-04T10:10:00Z", "2026-05-04 15:00 IST", "2026-05-04 16:00 IST", 1},
		{"hour repeated at the fall back, first", config.QuotaHour, 0, "Europe/Paris", "2026-10-25T00:30:00Z", "2026-10-25 02:00 CEST", "2026-10-25 02:00 CET", 1},
		{"hour repeated at the fall back, second", config.QuotaHour, 0, "Europe/Paris", "2026-10-25T01:30:00Z", "2026-10-25 02:00 CET", "2026-10-25 03:00 CET", 1},
		{"day UTC", config.QuotaDay, 0, "UTC", "2026-05-04T00:00:00Z", "2026-05-04 00:00 UTC", "2026-05-05 00:00 UTC", 24},
		{"day in Tokyo is yesterday's UTC evening", config.QuotaDay, 0, "Asia/Tokyo", "2026-05-04T20:00:00Z", "2026-05-05 00:00 JST", "2026-05-06 00:00 JST", 24},
		{"day of the spring forward: 23 hours", config.QuotaDay, 0, "Europe/Paris", "2026-03-29T12:00:00Z", "2026-03-29 00:00 CET", "2026-03-30 00:00 CEST", 23},
		{"day of the fall back: 25 hours", config.QuotaDay, 0, "Europe/Paris", "2026-10-25T12:00:00Z", "2026-10-25 00:00 CEST", "2026-10-26 00:00 CET", 25},
		{"New York spring forward", config.QuotaDay, 0, "America/New_York", "2026-03-08T23:00:00Z", "2026-03-08 00:00 EST", "2026-03-09 00:00 EDT", 23},
		{"New York fall back", config.QuotaDay, 0, "America/New_York", "2026-11-01T04:30:00Z", "2026-11-01 00:00 EDT", "2026-11-02 00:00 EST", 25},
		{"one second before midnight", config.QuotaDay, 0, "UTC", "2026-05-04T23:59:59Z", "2026-05-04 00:00 UTC", "2026-05-05 00:00 UTC", 24},
		{"week from Monday", config.QuotaWeek, 0, "UTC", "2026-05-06T12:00:00Z", "2026-05-04 00:00 UTC", "2026-05-11 00:00 UTC", 168},
		{"week on its Monday", config.QuotaWeek, 0, "UTC", "2026-05-04T00:00:00Z", "2026-05-04 00:00 UTC", "2026-05-11 00:00 UTC", 168},
		{"week on its Sunday", config.QuotaWeek, 0, "UTC", "2026-05-10T23:59:59Z", "2026-05-04 00:00 UTC", "2026-05-11 00:00 UTC", 168},
		{"ISO week 1 of 2026 starts in 2025", config.QuotaWeek, 0, "UTC", "2026-01-01T08:00:00Z", "2025-12-29 00:00 UTC", "2026-01-05 00:00 UTC", 168},
		{"ISO week 53 of 2026 ends in 2027", config.QuotaWeek, 0, "UTC", "2027-01-03T08:00:00Z", "2026-12-28 00:00 UTC", "2027-01-04 00:00 UTC", 168},
		{"week across the fall back: 169 hours", config.QuotaWeek, 0, "Europe/Paris", "2026-10-25T12:00:00Z", "2026-10-19 00:00 CEST", "2026-10-26 00:00 CET", 169},
		{"week in a zone ahead of UTC", config.QuotaWeek, 0, "Pacific/Auckland", "2026-05-10T13:00:00Z", "2026-05-11 00:00 NZST", "2026-05-18 00:00 NZST", 168},
		{"month", config.QuotaMonth, 0, "UTC", "2026-02-14T00:00:00Z", "2026-02-01 00:00 UTC", "2026-03-01 00:00 UTC", 28 * 24},
		{"month in a leap year", config.QuotaMonth, 0, "UTC", "2028-02-29T23:00:00Z", "2028-02-01 00:00 UTC", "2028-03-01 00:00 UTC", 29 * 24},
		{"month across the spring forward", config.QuotaMonth, 0, "Europe/Paris", "2026-03-15T00:00:00Z", "2026-03-01 00:00 CET", "2026-04-01 00:00 CEST", 31*24 - 1},
		{"month of December to January", config.QuotaMonth, 0, "UTC", "2026-12-31T23:59:59Z", "2026-12-01 00:00 UTC", "2027-01-01 00:00 UTC", 31 * 24},
		{"billing day 15, after it", config.QuotaMonth, 15, "UTC", "2026-05-20T00:00:00Z", "2026-05-15 00:00 UTC", "2026-06-15 00:00 UTC", 31 * 24},
		{"billing day 15, before it", config.QuotaMonth, 15, "UTC", "2026-05-14T23:00:00Z", "2026-04-15 00:00 UTC", "2026-05-15 00:00 UTC", 30 * 24},
		{"billing day 15, across the year", config.QuotaMonth, 15, "UTC", "2027-01-02T00:00:00Z", "2026-12-15 00:00 UTC", "2027-01-15 00:00 UTC", 31 * 24},
		{"billing day 31 in February starts on its last day", config.QuotaMonth, 31, "UTC", "2026-02-28T10:00:00Z", "2026-02-28 00:00 UTC", "2026-03-31 00:00 UTC", 31 * 24},
		{"billing day 31 before the end of February", config.QuotaMonth, 31, "UTC", "2026-02-27T10:00:00Z", "2026-01-31 00:00 UTC", "2026-02-28 00:00 UTC", 28 * 24},
		{"billing day 31 in a leap February", config.QuotaMonth, 31, "UTC", "2028-02-29T00:00:00Z", "2028-02-29 00:00 UTC", "2028-03-31 00:00 UTC", 31 * 24},
		{"billing day 30 in a leap February", config.QuotaMonth, 30, "UTC", "2028-02-28T23:59:59Z", "2028-01-30 00:00 UTC", "2028-02-29 00:00 UTC", 30 * 24},
		{"billing day 31 into April", config.QuotaMonth, 31, "UTC", "2026-04-30T00:00:00Z", "2026-04-30 00:00 UTC", "2026-05-31 00:00 UTC", 31 * 24},
		{"billing day 31 in a zone", config.QuotaMonth, 31, "America/Los_Angeles", "2026-03-01T05:00:00Z", "2026-02-28 00:00 PST", "2026-03-31 00:00 PDT", 31*24 - 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			loc, err := time.LoadLocation(tc.zone)
			if err != nil {
				t.Fatal(err)
			}
			now, err := time.Parse(time.RFC3339Nano, tc.now)
			if err != nil {
				t.Fatal(err)
			}
			start, end := rls.Period(&config.Quota{Period: tc.period, BillingDay: tc.billingDay, TimeZone: tc.zone}, loc, now)
			if got := start.In(loc).Format(layout); got != tc.wantStart {
				t.Errorf("start: got %s, want %s", got, tc.wantStart)
			}
			if got := end.In(loc).Format(layout); got != tc.wantEnd {
				t.Errorf("end: got %s, want %s", got, tc.wantEnd)
			}
			if got := end.Sub(start).Hours(); got != tc.wantHours {
				t.Errorf("length: got %v hours, want %v", got, tc.wantHours)
			}
			if now.Before(start) || !now.Before(end) {
				t.Errorf("now %v is not in [%v, %v)", now, start, end)
			}
		})
	}
}

// TestPeriodContiguous: at every hour of two years, in zones with
// daylight-saving changes, each period's end is the next period's start,
// and no instant falls outside its period. (Hours are not checked in
// Lord Howe, whose clock moves by 30 minutes: the wall clock's hours
// there overlap by half an hour once a year, docs/configuration.md.)
func TestPeriodContiguous(t *testing.T) {
	for _, zone := range []string{"UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []config.Quota{{Period: config.QuotaHour}, {Period: config.QuotaDay}, {Period: config.QuotaWeek},
			{Period: config.QuotaMonth}, {Period: config.QuotaMonth, BillingDay: 31}, {Period: config.QuotaMonth, BillingDay: 29}} {
			if zone == "Australia/Lord_Howe" && q.Period == config.QuotaHour {
				continue
			}
			now := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
			_, end := rls.Period(&q, loc, now)
			for i := 0; i < 2*366*24; i++ {
				now = now.Add(time.Hour)
				start, e := rls.Period(&q, loc, now)
				if now.Before(start) || !now.Before(e) {
					t.Fatalf("%s %+v at %v: not in [%v, %v)", zone, q, now, start, e)
				}
				if e != end && !start.Equal(end) {
					t.Fatalf("%s %+v at %v: period starts at %v, the one before ended at %v", zone, q, now, start, end)
				}
				end = e
			}
		}
	}
}
