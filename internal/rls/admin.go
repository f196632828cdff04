package rls

import (
	"context"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tokengate/tokengate/rlscontract"
)

// Pinger is what Readiness checks; *Store is one.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Readiness pings Redis every interval in the background: Ready reports
// whether the last PING was answered.
type Readiness struct {
	ready atomic.Bool
	stop  chan struct{}
	once  sync.Once
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
			was := r.ready.Swap(err == nil)
			if logf != nil && (was != (err == nil) || first && err != nil) {
				if err == nil {
					logf("redis answers PING: ready")
				} else {
					logf("redis does not answer PING: not ready: " + err.Error())
				}
			}
			first = false
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
		}
	}()
	return r
}

// Ready reports whether Redis answered the last PING.
func (r *Readiness) Ready() bool { return r.ready.Load() }

// Stop ends the pinging.
func (r *Readiness) Stop() { r.once.Do(func() { close(r.stop) }) }

// maxJSONBody bounds a /json request body.
const maxJSONBody = 1 << 20

// AdminHandler serves the admin listener:
//
//	/metrics  Prometheus text (Metrics.WriteTo)
//	/ready    200 when Redis answered the last PING, 503 before and otherwise
//	/json     POST a RateLimitRequest in protobuf's JSON form, get the
//	          RateLimitResponse: 200 (OK) and 429 (OVER_LIMIT) with the
//	          response, as envoyproxy/ratelimit's /json (server_impl.go);
//	          400 (invalid request); 503 (Redis failed), where
//	          envoyproxy/ratelimit answers 400 for any failed decision.
//	          The filter's settings.rls.protocol "json" reads 200 and 429
//	          and takes any other status as an error, so both agree.
func AdminHandler(srv *Server, m *Metrics, ready *Readiness) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("content-type", "text/plain; version=0.0.4")
		_, _ = m.WriteTo(w)
	})
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Ready() {
			http.Error(w, "redis not answering PING\n", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
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
		if v := r.Header.Values(rlscontract.SettleHeader); len(v) > 0 {
			// A settlement over JSON carries its mark as an HTTP header, as
			// the gRPC call carries it as metadata (settle.go).
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(rlscontract.SettleHeader, v[0]))
		}
		resp, err := srv.ShouldRateLimit(ctx, &req)
		if err != nil {
			code := http.StatusServiceUnavailable
			if status.Code(err) == codes.InvalidArgument {
				code = http.StatusBadRequest
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
