package rls

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/sharedstate"
)

// The admin API (docs/rls.md, "Admin API"): on the admin listener,
//
//	PUT    /v1/overrides/<rule>?key=<composite>  {"limit": N} or {"rate": R, "burst": B}, "ttl_seconds" optional
//	GET    /v1/overrides/<rule>?key=<composite>  the override
//	DELETE /v1/overrides/<rule>?key=<composite>  removes it
//	GET    /v1/usage/<rule>?key=<composite>      what the key used and has left (usage.go)
//
// An override is the Redis hash "ov:{<rule>:<composite>}"
// (redisstore.OverrideKey), read by the decision in the same script
// call as the key's bucket or quota: every replica applies it from the
// next request on. A call that is not authenticated (AdminGate), names no
// rule the configuration in force decides, or carries a key or a body out
// of bounds is refused with a JSON error before anything reaches Redis.

// AdminStore is what the admin API needs of the store; *redisstore.Store
// is one.
type AdminStore interface {
	SetOverride(ctx context.Context, key string, fields []redisstore.Field, ttl time.Duration) error
	DeleteOverride(ctx context.Context, key string) (bool, error)
	ReadHashes(ctx context.Context, keys ...string) ([]redisstore.Hash, error)
	ReadString(ctx context.Context, key string) (string, bool, error)
}

// Bounds of an override: the configuration's own (config's maxRate and
// maxBurst, pinned by TestOverrideBoundsAreTheConfigs), so that an
// override can set nothing a configuration could not.
const (
	maxOverrideRate  = 1e9
	maxOverrideBurst = 1e12
	// maxFillSeconds bounds burst/rate as the configuration does.
	maxFillSeconds = 1e9
	// maxOverrideTTL bounds ttl_seconds: ten years.
	maxOverrideTTL = 10 * 366 * 86400
	// maxAdminBody bounds a PUT's body, maxAdminValue one value=.
	maxAdminBody  = 4096
	maxAdminValue = 4096
)

// Admin API calls by API (tokengate_rls_admin_calls_total's api label).
const (
	apiOverrides = iota
	apiUsage
	numAdminAPIs
)

var adminAPINames = [numAdminAPIs]string{"overrides", "usage"}

// Outcomes of an admin API call (tokengate_rls_admin_calls_total's
// outcome label).
const (
	adminOK              = iota
	adminNotFound        // no override (GET, DELETE)
	adminUnknownRule     // the configuration in force has no such rule
	adminBadRequest      // a malformed key, body or value out of bounds
	adminUnauthenticated // no credential
	adminForbidden       // a wrong credential, certificate or access level
	adminDisabled        // no admin credential configured
	adminRedisError      // Redis failed: nothing known
	numAdminOutcomes
)

var adminOutcomeNames = [numAdminOutcomes]string{"ok", "not_found", "unknown_rule", "bad_request",
	"unauthenticated", "forbidden", "disabled", "redis_error"}

// AdminAPI serves the admin API and the usage endpoint over the
// configuration a Server has in force.
type AdminAPI struct {
	srv   *Server
	store AdminStore
	gate  *AdminGate
	calls [numAdminAPIs][numAdminOutcomes]prometheus.Counter
}

// NewAdminAPI returns the admin API of srv's configuration, writing to
// store, admitting the calls gate admits, counting its calls into m
// (tokengate_rls_admin_calls_total).
func NewAdminAPI(srv *Server, store AdminStore, gate *AdminGate, m *Metrics) *AdminAPI {
	a := &AdminAPI{srv: srv, store: store, gate: gate}
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_admin_calls_total",
		Help: "Calls of the admin API and the usage endpoint, by API and outcome (docs/rls.md#admin-api)."}, []string{"api", "outcome"})
	if err := m.Registry().Register(vec); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			vec = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	for i := range a.calls {
		for j := range a.calls[i] {
			a.calls[i][j] = vec.WithLabelValues(adminAPINames[i], adminOutcomeNames[j])
		}
	}
	return a
}

// Handler serves the admin API under /v1/ and everything else with next
// (the admin listener's AdminHandler).
func (a *AdminAPI) Handler(next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/overrides/", a.serveOverride)
	mux.HandleFunc("/v1/usage/", a.serveUsage)
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		a.fail(w, apiOverrides, &refusal{http.StatusNotFound, adminBadRequest, "no such endpoint: the admin API has /v1/overrides/<rule> and /v1/usage/<rule>"})
	})
	mux.Handle("/", next)
	return mux
}

// fail answers a refusal as {"error": msg} and counts it.
func (a *AdminAPI) fail(w http.ResponseWriter, api int, ref *refusal) {
	a.calls[api][ref.outcome].Inc()
	if ref.status == http.StatusUnauthorized {
		w.Header().Set("www-authenticate", `Bearer realm="tokengate-rls admin"`)
	}
	writeJSON(w, ref.status, map[string]any{"error": ref.msg})
}

// ok answers v, 200, and counts the call.
func (a *AdminAPI) ok(w http.ResponseWriter, api int, v any) {
	a.calls[api][adminOK].Inc()
	writeJSON(w, http.StatusOK, v)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"unencodable answer"}`)
	}
	w.Header().Set("content-type", "application/json")
	w.Header().Set("cache-control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func badRequest(msg string) *refusal { return &refusal{http.StatusBadRequest, adminBadRequest, msg} }

func redisFailed(err error) *refusal {
	return &refusal{http.StatusServiceUnavailable, adminRedisError, "redis: " + err.Error() + " (nothing is known of the result; try again)"}
}

// Kinds of rule an override applies to.
const (
	kindNone   = iota
	kindBucket // a token bucket: rate, burst
	kindQuota  // a calendar quota: limit
)

// overrideKind says what an override of r sets, or why r takes none.
func overrideKind(r *config.Rule) (int, string) {
	switch {
	case r.Quota != nil:
		return kindQuota, ""
	case r.Lease != nil:
		return kindNone, "runs in lease mode: its proxies spend leased tokens without asking per request, so an override could not apply at once"
	case r.InFlight != nil:
		return kindNone, "limits requests in flight, not a rate"
	case r.Limit.Window > 0:
		return kindNone, "is a fixed window: overrides apply to token buckets and quotas"
	}
	return kindBucket, ""
}

// target is what an admin call names: the rule, its kind, the composite
// key and the override's Redis key.
type target struct {
	rule      *config.Rule
	kind      int
	composite string
	key       string // redisstore.OverrideKey
}

// resolveTarget reads the rule of path (after prefix) and the key of q,
// for the configuration in force.
func (a *AdminAPI) resolveTarget(path, prefix string, q url.Values, extra ...string) (target, *refusal) {
	name := strings.TrimPrefix(path, prefix)
	if name == "" || strings.Contains(name, "/") {
		return target{}, badRequest("the path is " + prefix + "<rule>, got " + strconv.Quote(path))
	}
	cfg := a.srv.Config()
	if cfg.cluster == nil {
		return target{}, &refusal{http.StatusNotFound, adminUnknownRule, "no rule " + strconv.Quote(name) + ": this configuration has no tokengate cluster rules (the drop-in's rules take no overrides)"}
	}
	r := cfg.cluster[name]
	if r == nil {
		return target{}, &refusal{http.StatusNotFound, adminUnknownRule, "no rule " + strconv.Quote(name) + " with \"scope\": \"cluster\" in the configuration in force"}
	}
	kind, why := overrideKind(r)
	if kind == kindNone {
		return target{}, badRequest("rule " + strconv.Quote(name) + " " + why)
	}
	comp, ref := compositeOf(q, r, extra)
	if ref != nil {
		return target{}, ref
	}
	return target{rule: r, kind: kind, composite: comp, key: redisstore.OverrideKey(r.Name, comp)}, nil
}

// compositeOf reads the composite key of q: key=<composite>, as the filter
// builds it, or one value= per limit key of r, in order, composed as the
// filter composes them (sharedstate.AppendComposite).
func compositeOf(q url.Values, r *config.Rule, extra []string) (string, *refusal) {
	keys, values := q["key"], q["value"]
	for p := range q {
		if p != "key" && p != "value" && !slices.Contains(extra, p) {
			return "", badRequest("unknown query parameter " + strconv.Quote(p) + ": give key=<composite> or value=<v> per limit key")
		}
	}
	switch {
	case len(keys) > 0 && len(values) > 0:
		return "", badRequest("give key= or value=, not both")
	case len(keys) > 1:
		return "", badRequest("give one key=")
	case len(keys) == 1:
		k := keys[0]
		if len(k) > maxComposite {
			return "", badRequest("key: at most " + strconv.Itoa(maxComposite) + " bytes (8 limit keys of at most " +
				strconv.Itoa(sharedstate.MaxValueLen) + " bytes each, as the filter writes them, and their separators), got " + strconv.Itoa(len(k)))
		}
		if cleanComposite(k) != k {
			return "", badRequest("key: not a composite key as the filter builds it (printable ASCII, no braces); give the raw values with value= instead")
		}
		if n := strings.Count(k, "|") + 1; len(r.Keys) > 0 && n != len(r.Keys) || len(r.Keys) == 0 && k != "" {
			return "", badRequest("key: rule " + strconv.Quote(r.Name) + " has " + strconv.Itoa(len(r.Keys)) +
				" limit keys, the composite joins one value per key with '|'")
		}
		return k, nil
	case len(values) > 0:
		if len(values) != len(r.Keys) {
			return "", badRequest("rule " + strconv.Quote(r.Name) + " has " + strconv.Itoa(len(r.Keys)) +
				" limit keys: give one value= per key, got " + strconv.Itoa(len(values)))
		}
		for i, v := range values {
			if len(v) > maxAdminValue {
				return "", badRequest("value " + strconv.Itoa(i+1) + ": at most " + strconv.Itoa(maxAdminValue) + " bytes, got " + strconv.Itoa(len(v)))
			}
		}
		return string(sharedstate.AppendComposite(nil, values)), nil
	}
	if len(r.Keys) == 0 {
		return "", nil // the rule's one key
	}
	return "", badRequest("name the key: key=<composite> or one value= per limit key of rule " + strconv.Quote(r.Name))
}

// serveOverride serves /v1/overrides/<rule>.
func (a *AdminAPI) serveOverride(w http.ResponseWriter, r *http.Request) {
	if ref := a.gate.authorize(r, accessAdmin); ref != nil {
		a.fail(w, apiOverrides, ref)
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodPut, http.MethodDelete:
	default:
		w.Header().Set("allow", "GET, PUT, DELETE")
		a.fail(w, apiOverrides, &refusal{http.StatusMethodNotAllowed, adminBadRequest, "use GET, PUT or DELETE"})
		return
	}
	t, ref := a.resolveTarget(r.URL.Path, "/v1/overrides/", r.URL.Query())
	if ref != nil {
		a.fail(w, apiOverrides, ref)
		return
	}
	switch r.Method {
	case http.MethodPut:
		fields, ttl, ref := readOverride(r.Body, t)
		if ref != nil {
			a.fail(w, apiOverrides, ref)
			return
		}
		if err := a.store.SetOverride(r.Context(), t.key, fields, ttl); err != nil {
			a.fail(w, apiOverrides, redisFailed(err))
			return
		}
		a.ok(w, apiOverrides, overrideAnswer(t, fieldMap(fields), ttl))
	case http.MethodGet:
		hs, err := a.store.ReadHashes(r.Context(), t.key)
		if err != nil {
			a.fail(w, apiOverrides, redisFailed(err))
			return
		}
		if len(hs[0].Fields) == 0 {
			a.fail(w, apiOverrides, &refusal{http.StatusNotFound, adminNotFound, "no override of rule " + strconv.Quote(t.rule.Name) + " for key " + strconv.Quote(t.composite)})
			return
		}
		a.ok(w, apiOverrides, overrideAnswer(t, parseFields(hs[0].Fields), hs[0].TTL))
	case http.MethodDelete:
		existed, err := a.store.DeleteOverride(r.Context(), t.key)
		if err != nil {
			a.fail(w, apiOverrides, redisFailed(err))
			return
		}
		if !existed {
			a.fail(w, apiOverrides, &refusal{http.StatusNotFound, adminNotFound, "no override of rule " + strconv.Quote(t.rule.Name) + " for key " + strconv.Quote(t.composite)})
			return
		}
		a.ok(w, apiOverrides, map[string]any{"rule": t.rule.Name, "key": t.composite, "deleted": true})
	}
}

// overrideBody is a PUT's body.
type overrideBody struct {
	Limit      *float64 `json:"limit"`
	Rate       *float64 `json:"rate"`
	Burst      *float64 `json:"burst"`
	TTLSeconds *float64 `json:"ttl_seconds"`
}

// readOverride reads and checks a PUT's body for t: the fields to store
// and the expiry (0: none).
func readOverride(body io.Reader, t target) ([]redisstore.Field, time.Duration, *refusal) {
	raw, err := io.ReadAll(io.LimitReader(body, maxAdminBody+1))
	if err != nil {
		return nil, 0, badRequest("unreadable body: " + err.Error())
	}
	if len(raw) > maxAdminBody {
		return nil, 0, badRequest("body: at most " + strconv.Itoa(maxAdminBody) + " bytes")
	}
	var b overrideBody
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return nil, 0, badRequest("body: not an override (" + jsonProblem(err) + `): {"limit": N} for a quota, {"rate": R, "burst": B} for a token bucket, "ttl_seconds" optional`)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, 0, badRequest("body: one JSON object, nothing after it")
	}
	var ttl time.Duration
	if b.TTLSeconds != nil {
		s := *b.TTLSeconds
		if s != math.Trunc(s) || s < 1 || s > maxOverrideTTL {
			return nil, 0, badRequest("ttl_seconds: a whole number of seconds from 1 to " + strconv.Itoa(maxOverrideTTL) + ", got " + adminNum(s))
		}
		ttl = time.Duration(s) * time.Second
	}
	name := strconv.Quote(t.rule.Name)
	if t.kind == kindQuota {
		if b.Rate != nil || b.Burst != nil {
			return nil, 0, badRequest("rule " + name + " is a quota: its override sets limit, not rate or burst")
		}
		if b.Limit == nil {
			return nil, 0, badRequest("limit: required for quota rule " + name)
		}
		if err := inBounds("limit", *b.Limit, maxOverrideBurst); err != nil {
			return nil, 0, err
		}
		return []redisstore.Field{{Name: redisstore.OverrideLimit, Value: *b.Limit}}, ttl, nil
	}
	if b.Limit != nil {
		return nil, 0, badRequest("rule " + name + " is a token bucket: its override sets rate and burst, not limit")
	}
	if b.Rate == nil && b.Burst == nil {
		return nil, 0, badRequest("rate or burst (or both): required for token-bucket rule " + name)
	}
	var fields []redisstore.Field
	rate, burst := t.rule.Limit.Rate, t.rule.Limit.Burst
	if b.Rate != nil {
		if err := inBounds("rate", *b.Rate, maxOverrideRate); err != nil {
			return nil, 0, err
		}
		rate = *b.Rate
		fields = append(fields, redisstore.Field{Name: redisstore.OverrideRate, Value: rate})
	}
	if b.Burst != nil {
		if err := inBounds("burst", *b.Burst, maxOverrideBurst); err != nil {
			return nil, 0, err
		}
		burst = *b.Burst
		fields = append(fields, redisstore.Field{Name: redisstore.OverrideBurst, Value: burst})
	}
	// The limit in force is the override's fields over the rule's: it
	// must be one the configuration accepts.
	if burst < rate && t.rule.Delay.MaxReserved == 0 {
		return nil, 0, badRequest("burst " + adminNum(burst) + " is below rate " + adminNum(rate) + " (the rule's where the override sets none): the bucket could never hold a second's tokens")
	}
	if burst/rate > maxFillSeconds {
		return nil, 0, badRequest("rate " + adminNum(rate) + ": must be >= burst/1e9 (" + adminNum(burst/maxFillSeconds) + ") so that an empty bucket refills within 1e9 seconds")
	}
	return fields, ttl, nil
}

// inBounds refuses a value that is not in (0, max].
func inBounds(field string, v, max float64) *refusal {
	if !(v > 0 && v <= max) {
		return badRequest(field + ": must be > 0 and <= " + adminNum(max) + ", got " + adminNum(v))
	}
	return nil
}

// jsonProblem says what is wrong with a body, without echoing it.
func jsonProblem(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return "malformed JSON at byte " + strconv.FormatInt(se.Offset, 10)
	case errors.As(err, &te):
		return te.Field + ": want a number"
	case errors.Is(err, io.EOF):
		return "empty body"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	}
	return "malformed JSON"
}

// overrideAnswer is the JSON answer describing an override.
func overrideAnswer(t target, fields map[string]float64, ttl time.Duration) map[string]any {
	out := map[string]any{"rule": t.rule.Name, "key": t.composite, "kind": kindName(t.kind), "override": fields}
	if ttl > 0 {
		out["ttl_seconds"] = int64(math.Ceil(ttl.Seconds()))
	}
	return out
}

func kindName(k int) string {
	if k == kindQuota {
		return "quota"
	}
	return "token_bucket"
}

// fieldMap is fields as a JSON object.
func fieldMap(fields []redisstore.Field) map[string]float64 {
	m := make(map[string]float64, len(fields))
	for _, f := range fields {
		m[f.Name] = f.Value
	}
	return m
}

// parseFields reads the stored hash's numeric fields (limit, rate,
// burst); others and unreadable values are left out.
func parseFields(h map[string]string) map[string]float64 {
	m := map[string]float64{}
	for _, k := range []string{redisstore.OverrideLimit, redisstore.OverrideRate, redisstore.OverrideBurst} {
		if v, ok := h[k]; ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				m[k] = f
			}
		}
	}
	return m
}

func adminNum(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
