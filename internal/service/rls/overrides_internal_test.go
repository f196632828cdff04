package rls

import (
	"net/url"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/redisstore"
)

// FuzzReadOverride: no body makes readOverride panic, and a body it
// accepts gives fields of the rule's kind only, each within the
// configuration's bounds, and a token bucket whose limit in force (the
// override's fields over the rule's) the configuration would accept.
func FuzzReadOverride(f *testing.F) {
	for _, s := range []string{`{"limit": 5}`, `{"rate": 2, "burst": 20}`, `{"burst": 1e12, "ttl_seconds": 60}`, `{"rate": 1e-300}`,
		`{"limit": 1e400}`, `{"rate": -0}`, `{"ttl_seconds": 1e10, "rate": 1}`, `{}`, `[]`, `null`, `{"rate": 1}{}`, "\xff"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	bucketRule := &config.Rule{Name: "b", Limit: bucket.Limit{Rate: 1, Burst: 10}}
	quotaRule := &config.Rule{Name: "q", Limit: bucket.Limit{Rate: 1, Burst: 100}, Quota: &config.Quota{Limit: 100}}
	f.Fuzz(func(t *testing.T, body string, quota bool) {
		tg := target{rule: bucketRule, kind: kindBucket}
		if quota {
			tg = target{rule: quotaRule, kind: kindQuota}
		}
		fields, ttl, ref := readOverride(strings.NewReader(body), tg)
		if ref != nil {
			if ref.status != 400 || ref.msg == "" {
				t.Fatalf("%q: refusal %+v, want 400 with a message", body, ref)
			}
			return
		}
		if ttl < 0 || ttl.Seconds() > maxOverrideTTL {
			t.Fatalf("%q: ttl %v out of bounds", body, ttl)
		}
		if len(fields) == 0 {
			t.Fatalf("%q: accepted with no field", body)
		}
		rate, burst := tg.rule.Limit.Rate, tg.rule.Limit.Burst
		for _, fl := range fields {
			switch {
			case quota && fl.Name == redisstore.OverrideLimit && fl.Value > 0 && fl.Value <= maxOverrideBurst:
			case !quota && fl.Name == redisstore.OverrideRate && fl.Value > 0 && fl.Value <= maxOverrideRate:
				rate = fl.Value
			case !quota && fl.Name == redisstore.OverrideBurst && fl.Value > 0 && fl.Value <= maxOverrideBurst:
				burst = fl.Value
			default:
				t.Fatalf("%q: field %+v out of bounds or of the wrong kind", body, fl)
			}
		}
		if !quota && (burst < rate || burst/rate > maxFillSeconds) {
			t.Fatalf("%q: accepted rate %v burst %v", body, rate, burst)
		}
	})
}

// FuzzCompositeOf: no query makes compositeOf panic, and a composite it
// accepts is one the service would use unchanged as a bucket's name
// (cleanComposite), within the composite bound.
func FuzzCompositeOf(f *testing.F) {
	for _, s := range []string{"key=alice", "value=a&value=b", "key=a%7Cb", "value=%7B%7D&value=x", "key=" + strings.Repeat("k", 600), "", "key=&key=", "value=" + strings.Repeat("%FF", 100) + "&value=y"} {
		f.Add(s)
	}
	r := &config.Rule{Name: "two", Keys: make([]config.Descriptor, 2)}
	f.Fuzz(func(t *testing.T, query string) {
		q, err := url.ParseQuery(query)
		if err != nil {
			return
		}
		comp, ref := compositeOf(q, r, nil)
		if ref != nil {
			return
		}
		if len(comp) > maxComposite || cleanComposite(comp) != comp {
			t.Fatalf("%q: composite %q is not one the decision uses", query, comp)
		}
	})
}
