// Command rlsload is a load generator for rate-limit services that speak
// Envoy's RLS v3 API (envoy.service.ratelimit.v3.RateLimitService): C
// concurrent clients, each sending ShouldRateLimit and waiting for the
// answer before the next (a closed loop, as Envoy's callers are), over a few
// HTTP/2 connections, until N decisions or D elapse. It prints one JSON line:
// decisions per second, p50 and p99 latency, OVER_LIMIT answers and errors.
//
// Each request carries one descriptor, [("tokengate_rule", RULE), ("key",
// k)], the one the tokengate filter sends for a cluster-scope rule; k is
// "k0" with -keys 1 (one hot key), or drawn uniformly from -keys values.
// bench/run.sh runs it against tokengate-rls and envoyproxy/ratelimit on the
// same Redis, interleaved.
//
//	rlsload -addr 127.0.0.1:8081 -name tokengate-rls -keys 10000 -c 32 -n 200000 -d 10s
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "rlsload:", err)
		}
		os.Exit(2)
	}
}

type options struct {
	addr, name, domain, rule string
	keys, clients, conns     int
	n                        int64
	d, warmup, timeout       time.Duration
}

// Result is the JSON line rlsload prints.
type Result struct {
	Name      string  `json:"name"`
	Keys      int     `json:"keys"`
	Clients   int     `json:"clients"`
	Decisions int64   `json:"decisions"` // answered with OK or OVER_LIMIT
	OverLimit int64   `json:"over_limit"`
	Errors    int64   `json:"errors"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"` // decisions per second
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("rlsload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8081", "the service's gRPC address")
	fs.StringVar(&o.name, "name", "", "label of the result line (default: -addr)")
	fs.StringVar(&o.domain, "domain", "tokengate", "RateLimitRequest.domain")
	fs.StringVar(&o.rule, "rule", "bench", "value of the tokengate_rule entry")
	fs.IntVar(&o.keys, "keys", 1, "distinct values of the key entry (1: one hot key)")
	fs.IntVar(&o.clients, "c", 32, "concurrent clients (requests in flight)")
	fs.IntVar(&o.conns, "conns", 2, "HTTP/2 connections the clients share")
	fs.Int64Var(&o.n, "n", 200000, "stop after this many requests")
	fs.DurationVar(&o.d, "d", 10*time.Second, "stop after this long")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "load before measuring (not counted)")
	fs.DurationVar(&o.timeout, "timeout", time.Second, "deadline of each call")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.keys < 1 || o.clients < 1 || o.conns < 1 || o.n < 1 || o.d <= 0 {
		return o, errors.New("-keys, -c, -conns, -n and -d must be positive")
	}
	if o.name == "" {
		o.name = o.addr
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	var clients []rlspb.RateLimitServiceClient
	for range o.conns {
		cc, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cc.Close()
		clients = append(clients, rlspb.NewRateLimitServiceClient(cc))
	}
	// One request per key, built once: the generator should spend its
	// CPU on the calls, not on building messages.
	reqs := make([]*rlspb.RateLimitRequest, o.keys)
	for i := range reqs {
		reqs[i] = &rlspb.RateLimitRequest{Domain: o.domain, HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "tokengate_rule", Value: o.rule}, {Key: "key", Value: "k" + strconv.Itoa(i)}},
		}}}
	}
	// The service must answer before the load starts.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err = clients[0].ShouldRateLimit(ctx, reqs[0], grpc.WaitForReady(true))
	cancel()
	if err != nil {
		return fmt.Errorf("%s: first call: %w", o.addr, err)
	}
	if o.warmup > 0 {
		load(o, clients, reqs, o.warmup, 1<<62)
	}
	res := load(o, clients, reqs, o.d, o.n)
	return json.NewEncoder(stdout).Encode(res)
}

// load runs o.clients closed loops until n requests were sent or d passed.
func load(o options, clients []rlspb.RateLimitServiceClient, reqs []*rlspb.RateLimitRequest, d time.Duration, n int64) Result {
	var sent, over, errs atomic.Int64
	lat := make([][]time.Duration, o.clients)
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%len(clients)]
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			mine := make([]time.Duration, 0, 1024)
			for sent.Add(1) <= n && time.Now().Before(deadline) {
				r := reqs[0]
				if len(reqs) > 1 {
					r = reqs[rng.IntN(len(reqs))]
				}
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
				resp, err := c.ShouldRateLimit(ctx, r)
				cancel()
				if err != nil {
					errs.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
				if resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
					over.Add(1)
				}
			}
			lat[w] = mine
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	q := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Nanoseconds()) / 1e3
	}
	return Result{
		Name: o.name, Keys: o.keys, Clients: o.clients,
		Decisions: int64(len(all)), OverLimit: over.Load(), Errors: errs.Load(),
		Seconds: elapsed.Seconds(), PerSecond: float64(len(all)) / elapsed.Seconds(),
		P50us: q(0.50), P99us: q(0.99),
	}
}
