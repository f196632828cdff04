package rls

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/rlscontract"
)

// Pinger is what Readiness checks; *redisstore.Store is one.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Readiness says whether the service can decide: it pings Redis every
// interval in the background and is ready while the last PING was
// answered, until Drain, after which it never is. /ready and the gRPC
// health service (Watch) follow it; liveness (/live) does not.
type Readiness struct {
	ready atomic.Bool // the last PING was answered
	// why is the last Ping's error, when it failed.
	why      atomic.Pointer[string]
	draining atomic.Bool
	held     atomic.Bool // Hold: something besides Redis is missing
	stop     chan struct{}
	once     sync.Once

	mu       sync.Mutex // serialises watchers' calls, in order of changes
	watchers []func(ready bool)
	// told is what the watchers were told last, and what Ready reports:
	// /ready and the gRPC health service never disagree, even for the
	// instant between a change and the watchers' call.
	told atomic.Bool
}

// NewReadiness starts pinging p every interval; Stop ends it. logf, when
// not nil, is told when Redis starts or stops answering.
func NewReadiness(p Pinger, interval time.Duration, logf func(msg string)) *Readiness {
	r := &Readiness{stop: make(chan struct{})}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		first := true
		for {
			err := p.Ping(context.Background())
			changed := false // while not ready, the reason changed
			if err != nil {
				msg := "redis not answering PING: " + err.Error()
				if errors.Is(err, redisstore.ErrPermission) {
					msg = err.Error()
				}
				if old := r.why.Swap(&msg); old == nil || *old != msg {
					changed = true
				}
			}
			was := r.ready.Swap(err == nil)
			if logf != nil && (was != (err == nil) || err != nil && (first || changed)) {
				switch {
				case err == nil:
					logf("redis answers PING: ready")
				case errors.Is(err, redisstore.ErrPermission):
					logf("not ready: " + err.Error())
				default:
					logf("redis does not answer PING: not ready: " + err.Error())
				}
			}
			first = false
			r.tell()
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
		}
	}()
	return r
}

// Ready reports whether the service can decide: Redis answered the last
// PING, Drain was not called and nothing holds it (Hold).
func (r *Readiness) Ready() bool { return r.told.Load() }

// Why says why the service is not ready: held (Hold), or why Redis made
// it not ready the last time it did: PING not answered, or the
// permission the user lacks.
func (r *Readiness) Why() string {
	if r.ready.Load() && r.held.Load() {
		return "held: no configuration yet"
	}
	if p := r.why.Load(); p != nil {
		return *p
	}
	return "redis not answering PING"
}

// Hold makes the service not ready while held is true, whatever Redis
// does, for a condition of the caller's (the drop-in's
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: no configuration yet), and
// tells the watchers at once.
func (r *Readiness) Hold(held bool) {
	r.held.Store(held)
	r.tell()
}

// Draining reports whether Drain was called.
func (r *Readiness) Draining() bool { return r.draining.Load() }

// Watch calls f with Ready now and again whenever it changes; f must not
// block.
func (r *Readiness) Watch(f func(ready bool)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watchers = append(r.watchers, f)
	f(r.told.Load())
}

// tell gives the watchers Ready when it differs from what they were told.
func (r *Readiness) tell() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.ready.Load() && !r.draining.Load() && !r.held.Load()
	if now == r.told.Load() {
		return
	}
	for _, f := range r.watchers {
		f(now)
	}
	// After the watchers: once Ready reports a change, the gRPC health
	// service says it too.
	r.told.Store(now)
}

// Drain makes the service not ready for good (shutdown begins: load
// balancers and Envoy's health checks should send no new calls), and
// tells the watchers at once.
func (r *Readiness) Drain() {
	r.draining.Store(true)
	r.tell()
}

// Stop ends the pinging.
func (r *Readiness) Stop() { r.once.Do(func() { close(r.stop) }) }

// maxJSONBody bounds a /json request body.
const maxJSONBody = 1 << 20

// AdminHandler serves the admin listener:
//
//	/metrics  the metrics (Metrics.Registry), in Prometheus text or
//	          OpenMetrics as the scraper asks (promhttp)
//	/live     200 while the process serves: never depends on Redis
//	/ready    200 when the service can decide (Readiness.Ready): Redis
//	          answered the last PING, its user may run what the service
//	          runs, and shutdown has not begun; 503 before and otherwise,
//	          with the reason (Readiness.Why)
//	/json     POST a RateLimitRequest in protobuf's JSON form, get the
//	          RateLimitResponse: 200 (OK) and 429 (OVER_LIMIT) with the
//	          response, as envoyproxy/ratelimit's /json (server_impl.go);
//	          400 (invalid request); 503 (Redis failed), where
//	          envoyproxy/ratelimit answers 400 for any failed decision.
//	          The filter's settings.rls.protocol "json" reads 200 and 429
//	          and takes any other status as an error, so both agree. A
//	          write (a settlement, a lease call) needs the proxy's
//	          credential in the authorization header, as over gRPC: 401
//	          without one, 403 with a wrong one (docs/rls.md#trust-model).
func AdminHandler(srv *Server, m *Metrics, ready *Readiness) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry(), promhttp.HandlerOpts{}))
	mux.HandleFunc("/live", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "live\n")
	})
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case ready.Draining():
			http.Error(w, "shutting down\n", http.StatusServiceUnavailable)
		case !ready.Ready():
			http.Error(w, ready.Why()+"\n", http.StatusServiceUnavailable)
		default:
			_, _ = io.WriteString(w, "ready\n")
		}
	})
	mux.HandleFunc("/json", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("allow", "POST")
			http.Error(w, "POST a RateLimitRequest\n", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxJSONBody+1))
		if err != nil || len(body) > maxJSONBody {
			http.Error(w, "unreadable or too large body\n", http.StatusBadRequest)
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			http.Error(w, "not a RateLimitRequest: "+err.Error()+"\n", http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		var md metadata.MD
		if v := r.Header.Values(rlscontract.SettleHeader); len(v) > 0 {
			// A settlement over JSON carries its mark as an HTTP header, as
			// the gRPC call carries it as metadata (settle.go).
			md = metadata.Pairs(rlscontract.SettleHeader, v[0])
		}
		if v := r.Header.Values(CredentialHeader); len(v) > 0 {
			// And the proxy's credential, which a write needs (trust.go):
			// the admin listener has no client certificates.
			md = metadata.Join(md, metadata.MD{CredentialHeader: v})
		}
		if v := r.Header.Values(rlscontract.ReceiptHeader); len(v) > 0 {
			// And the stream's receipt id (receipt.go).
			md = metadata.Join(md, metadata.MD{rlscontract.ReceiptHeader: v})
		}
		if md != nil {
			ctx = metadata.NewIncomingContext(ctx, md)
		}
		resp, err := srv.ShouldRateLimit(ctx, &req)
		if err != nil {
			code := http.StatusServiceUnavailable
			switch status.Code(err) {
			case codes.InvalidArgument:
				code = http.StatusBadRequest
			case codes.Unauthenticated:
				code = http.StatusUnauthorized
			case codes.PermissionDenied:
				code = http.StatusForbidden
			}
			http.Error(w, status.Convert(err).Message()+"\n", code)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("content-type", "application/json")
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(out)
	})
	return mux
}
