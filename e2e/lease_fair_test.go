package e2e

import (
	"context"
	"encoding/binary"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// clockedStore runs the store's scripts at the test's clock instead of
// Redis TIME, so that a fleet can be stepped through fixed instants.
type clockedStore struct {
	s   *redisstore.Store
	now *float64
}

func (c clockedStore) Run(ctx context.Context, ops []redisstore.Op) []redisstore.Outcome {
	for i := range ops {
		ops[i].Now = fairAt(*c.now)
	}
	return c.s.Run(ctx, ops)
}

func (c clockedStore) Lease(ctx context.Context, op redisstore.LeaseOp) (redisstore.LeaseResult, error) {
	op.Now = fairAt(*c.now)
	return c.s.Lease(ctx, op)
}

// fairAt is a fake instant as the scripts take it (Op.Now).
func fairAt(sec float64) string { return strconv.FormatFloat(sec, 'f', 6, 64) }

// newFairStore connects a store to the redis-server at addr and waits
// until it answers PING.
func newFairStore(t *testing.T, addr string) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(redisstore.Options{Addrs: []string{addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	deadline := time.Now().Add(10 * time.Second)
	for s.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("store on %s: no PING answer within 10 s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

// fairFleet is n proxy processes (the filter on a test host each, one
// worker) with a lease rule, deciding against the real server and lease
// script on redis-server, all on one fake clock.
type fairFleet struct {
	now    float64
	srv    *rls.Server
	hosts  []*filtertest.Host
	plugs  []*filter.Plugin
	served []int // calls of each host answered so far
}

func newFairFleet(t *testing.T, cfg string, n int, store *redisstore.Store) *fairFleet {
	t.Helper()
	f := &fairFleet{now: 1736940000}
	rc, err := rls.ParseConfig([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	f.srv = rls.NewServer(rc, clockedStore{store, &f.now}, rls.NewMetrics(rc))
	f.srv.SetWriteAuth(rls.WriteAuth{Open: true}) // the hosts are the proxies
	for range n {
		h := filtertest.New()
		p := filter.NewPlugin(h)
		p.Clock = func() float64 { return f.now }
		if !p.OnConfigure([]byte(cfg)) {
			t.Fatalf("configure: %q", h.Logs(filter.LogError))
		}
		f.hosts, f.plugs = append(f.hosts, h), append(f.plugs, p)
	}
	f.served = make([]int, n)
	return f
}

// serve answers, through the server, every call process i made before
// now (a call is answered the step after it was made: it is in flight for
// a step).
func (f *fairFleet) serve(t *testing.T, i, upTo int) {
	t.Helper()
	h, p := f.hosts[i], f.plugs[i]
	for ; f.served[i] < upTo; f.served[i]++ {
		c := h.Calls[f.served[i]]
		if len(c.Body) < 5 || int(binary.BigEndian.Uint32(c.Body[1:5])) != len(c.Body)-5 {
			t.Fatalf("process %d: call body %x is not one gRPC frame", i, c.Body)
		}
		var req rlsv3.RateLimitRequest
		if err := proto.Unmarshal(c.Body[5:], &req); err != nil {
			t.Fatal(err)
		}
		resp, err := f.srv.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			st := status.Convert(err)
			h.Deliver(p, c.Token, filtertest.CallResponse{
				Headers:  [][2]string{{":status", "200"}, {"content-type", "application/grpc"}},
				Trailers: [][2]string{{"grpc-status", strconv.Itoa(int(st.Code()))}, {"grpc-message", st.Message()}}})
			continue
		}
		m, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		body := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(m)))
		h.Deliver(p, c.Token, filtertest.CallResponse{
			Headers:  [][2]string{{":status", "200"}, {"content-type", "application/grpc"}},
			Body:     append(body, m...),
			Trailers: [][2]string{{"grpc-status", "0"}}})
	}
}

// The fleet moved here from the service's package, which must not import
// the filter (a layer above it).

// TestLeaseFairShares: n processes with equal demand on one key (each
// offered the same requests per step, in the same order every step, so
// that process 0 always asks first), saturated, on a fake clock. Past the
// first second (the burst a full bucket holds goes to whoever asks), every
// process's share of the admissions over every 2 s window is within ±25 %
// of a fair share, no process goes half a second without an admission,
// and no window admits more than burst + rate x T. Before the service
// divided the refill among its holders, the first process to ask took
// nearly everything (issue 22: 0/98/0).
func TestLeaseFairShares(t *testing.T) {
	srv := redistest.Start(t)
	store := newFairStore(t, srv.Addr)
	const rate, burst = 60.0, 60.0
	cfg := `{"rules":[{"name":"fair","scope":"cluster","mode":"lease","lease_max":10,"lease_ttl_ms":2000,
		"limit_keys":["header:x-api-key"],"algorithm_config":{"rps":60,"burst":60}}],
		"settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":50,"on_error":"deny"}}}`
	for _, tc := range []struct {
		name string
		n    int
		// late is the step the last process starts sending at (the
		// others start at once); windows are checked from a second
		// after it.
		late int
	}{
		{"3 processes", 3, 0},
		{"5 processes", 5, 0},
		// A process whose demand starts when the others already hold
		// leases and divide the refill among themselves: it must get in.
		{"3 processes, one late", 3, 1000},
	} {
		n := tc.n
		t.Run(tc.name, func(t *testing.T) {
			srv.MustDo("FLUSHALL")
			f := newFairFleet(t, cfg, n, store)
			req := filtertest.Get("/", "192.0.2.1:5000", "x-api-key", "hot")
			const step, perStep = 0.001, 1 // 1,000 requests a second per process
			steps := 6000 + tc.late
			start := f.now
			// admitted[i][k]: process i's admissions in step k.
			admitted := make([][]int, n)
			for i := range admitted {
				admitted[i] = make([]int, steps)
			}
			continued := make([]int, n)
			other := 0
			for k := range steps {
				for i := range n {
					h, p := f.hosts[i], f.plugs[i]
					// Answer the calls of the previous step, tick, then
					// this step's requests.
					f.serve(t, i, len(h.Calls))
					h.Tick(p)
					for range perStep {
						if i == n-1 && k < tc.late {
							break
						}
						_, res := h.Start(p, req)
						switch {
						case res.RequestAction == filter.Continue:
							admitted[i][k]++
						case res.RequestAction == filter.Pause:
						default:
							other++
						}
					}
					admitted[i][k] += len(h.Continued) - continued[i]
					continued[i] = len(h.Continued)
				}
				f.now = start + float64(k+1)*step
			}
			if other != 0 {
				t.Errorf("%d requests neither admitted nor paused", other)
			}
			// Windows of 2 s, every 0.1 s from 1 s on.
			win, from, every := int(2/step), tc.late+int(1/step), int(0.1/step)
			total := make([]int, n)
			worstShare, starved := 0.0, -1
			for a := from; a+win <= steps; a += every {
				got, sum := make([]int, n), 0
				for i := range n {
					for k := a; k < a+win; k++ {
						got[i] += admitted[i][k]
					}
					sum += got[i]
				}
				fair := float64(sum) / float64(n)
				for i := range n {
					if d := (float64(got[i]) - fair) / fair; d > worstShare || -d > worstShare {
						worstShare = max(d, -d)
					}
				}
				if worstShare > 0.25 {
					t.Errorf("window from %.1f s: admissions %v, fair share %.1f each: more than 25 %% off", float64(a)*step, got, fair)
					break
				}
			}
			for i := range n {
				for k := range steps {
					total[i] += admitted[i][k]
				}
				// No half second without an admission, from 1 s on.
				for a := from; a+500 <= steps && starved < 0; a += 50 {
					s := 0
					for k := a; k < a+500; k++ {
						s += admitted[i][k]
					}
					if s == 0 {
						starved = i
						t.Errorf("process %d admitted nothing from %.2f s to %.2f s while the others did", i, float64(a)*step, float64(a+500)*step)
					}
				}
			}
			// The bound, over every window of whole steps.
			all := make([]int, steps)
			for k := range steps {
				for i := range n {
					all[k] += admitted[i][k]
				}
			}
			worst := -burst
			for a := range steps {
				s := 0
				for b := a; b < steps; b++ {
					s += all[b]
					// Admissions in steps a..b happened within (b-a) x step
					// plus the step itself.
					worst = max(worst, float64(s)-(burst+rate*float64(b-a+1)*step))
				}
			}
			t.Logf("%d processes: admitted %v in %.0f s; worst share %.0f %% off fair in a 2 s window; worst window %+.1f over burst + rate x T",
				n, total, float64(steps)*step, 100*worstShare, worst)
			if worst > 0 {
				t.Errorf("a window admitted %.1f more than burst + rate x T", worst)
			}
			sum := 0
			for _, v := range total {
				sum += v
			}
			// Every token the bucket gives should go out: at least the
			// burst plus the refill less what the holders can keep.
			if min := burst + rate*float64(steps)*step - float64(n)*(2*10) - rate*float64(tc.late)*step/2; float64(sum) < min {
				t.Errorf("admitted %d in all, want at least %.0f", sum, min)
			}
		})
	}
}
