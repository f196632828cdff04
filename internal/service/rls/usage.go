package rls

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/sharedstate"
)

// The usage endpoint (docs/rls.md, "Usage endpoint"): GET
// /v1/usage/<rule>?key=<composite> answers what one key used and has
// left, read from Redis as the decision reads it, with the override in
// force. For a quota rule (usageQuota): used, limit, remaining, the
// period and its reset. For a token bucket: its tokens now, its burst as
// the limit, and when it is full again.

// serveUsage serves /v1/usage/<rule>.
func (a *AdminAPI) serveUsage(w http.ResponseWriter, r *http.Request) {
	if ref := a.gate.authorize(r, accessUsage); ref != nil {
		a.fail(w, apiUsage, ref)
		return
	}
	if r.Method != http.MethodGet {
		w.Header().Set("allow", "GET")
		a.fail(w, apiUsage, &refusal{http.StatusMethodNotAllowed, adminBadRequest, "use GET"})
		return
	}
	q := r.URL.Query()
	t, ref := a.resolveTarget(r.URL.Path, "/v1/usage/", q, "identity_limit")
	if ref != nil {
		a.fail(w, apiUsage, ref)
		return
	}
	var answer map[string]any
	if t.kind != kindQuota && q.Has("identity_limit") {
		a.fail(w, apiUsage, badRequest("identity_limit: rule "+strconv.Quote(t.rule.Name)+" is not a quota"))
		return
	}
	if t.kind == kindQuota {
		answer, ref = a.usageQuota(r, t)
	} else {
		answer, ref = a.usageBucket(r, t)
	}
	if ref != nil {
		a.fail(w, apiUsage, ref)
		return
	}
	a.ok(w, apiUsage, answer)
}

// usageBucket answers the usage of a token bucket: the override's fields
// over the rule's limit, the stored tokens refilled to now.
func (a *AdminAPI) usageBucket(r *http.Request, t target) (map[string]any, *refusal) {
	hs, err := a.store.ReadHashes(r.Context(), t.key)
	if err != nil {
		return nil, redisFailed(err)
	}
	l := bucket.Limit{Rate: t.rule.Limit.Rate, Burst: t.rule.Limit.Burst}
	source := "rule"
	ov := parseFields(hs[0].Fields)
	if v, ok := ov["rate"]; ok && v > 0 {
		l.Rate, source = v, "override"
	}
	if v, ok := ov["burst"]; ok && v > 0 {
		l.Burst, source = v, "override"
	}
	bk := redisstore.BucketKey(t.rule.Name, t.composite)
	v, found, err := a.store.ReadString(r.Context(), bk)
	if err != nil {
		return nil, redisFailed(err)
	}
	now := a.srv.clock()
	secs := float64(now.UnixMicro()) / 1e6
	tokens := l.Burst // a missing bucket is a full one
	if found {
		st, err := sharedstate.ParseState([]byte(v))
		if err != nil {
			return nil, redisFailed(err)
		}
		tokens = l.Refill(st, secs).Tokens
	}
	tokens = math.Min(tokens, l.Burst)
	full := l.ResetAfter(tokens)
	return map[string]any{
		"rule": t.rule.Name, "key": t.composite, "kind": "token_bucket",
		"limit": l.Burst, "rate": l.Rate, "tokens": roundMicro(tokens),
		"remaining": math.Max(0, math.Floor(tokens)), "used": roundMicro(l.Burst - math.Max(0, tokens)),
		"reset":         now.Add(time.Duration(full * float64(time.Second))).UTC().Format(time.RFC3339),
		"reset_seconds": int64(math.Ceil(full)), "source": source,
	}, nil
}

// roundMicro rounds f to the microtoken, as the store keeps tokens.
func roundMicro(f float64) float64 { return math.Round(f*1e6) / 1e6 }

// usageQuota answers the usage of a quota rule in the period the clock is
// in: the consumption stored for the key in that period, the limit in
// force (the override's, else the identity's, else the rule's), what is
// left and when the period ends. It reads through the decision's own
// read (Server.Usage: its period, its key, its script), so the endpoint
// reads the very key the decision writes.
func (a *AdminAPI) usageQuota(r *http.Request, t target) (map[string]any, *refusal) {
	q := t.rule.Quota
	identity := ""
	if v := r.URL.Query()["identity_limit"]; len(v) > 0 {
		f, err := strconv.ParseFloat(v[0], 64)
		switch {
		case q.LimitSource == nil:
			return nil, badRequest("identity_limit: rule " + strconv.Quote(t.rule.Name) + " has no limit_source")
		case len(v) > 1 || err != nil || !(f > 0) || math.IsInf(f, 1):
			return nil, badRequest("identity_limit: one positive number, the limit the identity carries (bounded by max_limit)")
		}
		identity = v[0]
	}
	now := a.srv.clock()
	u, err := a.srv.Usage(r.Context(), t.rule.Name, t.composite)
	switch {
	case errors.Is(err, ErrNotQuota): // the configuration changed meanwhile
		return nil, &refusal{http.StatusNotFound, adminUnknownRule, "no quota rule " + strconv.Quote(t.rule.Name) + " in the configuration in force"}
	case err != nil:
		return nil, redisFailed(err)
	}
	limit, source := u.Limit, u.Source
	if identity != "" && source != SourceOverride {
		// The override wins over the identity, the identity over the
		// rule, as in the decision.
		limit, _ = IdentityLimit(q, identity)
		source = SourceIdentity
	}
	return map[string]any{
		"rule": t.rule.Name, "key": t.composite, "kind": "quota", "period": u.Period,
		"used": u.Used, "limit": limit, "remaining": math.Max(0, limit-u.Used), "source": source.String(),
		"period_start": u.PeriodStart.Format(time.RFC3339), "reset": u.Reset.Format(time.RFC3339),
		"reset_seconds": int64(math.Ceil(math.Max(0, u.Reset.Sub(now).Seconds()))),
	}, nil
}
