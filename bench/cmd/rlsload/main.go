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
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

func main() {
	// The generator's garbage is a few kilobytes a call over a small live
	// heap: collect less often (GOGC 400, as tokengate-rls does) unless
	// the environment says otherwise, to leave the services more CPU.
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(400)
	}
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
	pid, redisPid            int
	cpuprofile               string
}

// envoyWindow is Envoy's default initial_stream_window_size and
// initial_connection_window_size for HTTP/2 (envoy.config.core.v3.
// Http2ProtocolOptions).
const envoyWindow = 256 << 20

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
	// ServiceCPUus and RedisCPUus are the CPU time (user + system) the
	// processes of -pid and -redis-pid spent per decision during the
	// measured run, in microseconds: on a shared machine a steadier
	// figure than decisions/s. Zero when not asked for.
	ServiceCPUus float64 `json:"service_cpu_us,omitempty"`
	RedisCPUus   float64 `json:"redis_cpu_us,omitempty"`
	// LoadCPUus is the generator's own CPU time per decision, which the
	// machine's other processes do not have meanwhile.
	LoadCPUus float64 `json:"load_cpu_us,omitempty"`
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
	fs.IntVar(&o.pid, "pid", 0, "the service's process id: report its CPU time per decision (Linux /proc)")
	fs.IntVar(&o.redisPid, "redis-pid", 0, "Redis's process id: report its CPU time per decision")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write the generator's own CPU profile of the measured run to `file`")
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
	var clients []*grpc.ClientConn
	for range o.conns {
		cc, err := grpc.NewClient(o.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			// Static flow-control windows, of the size Envoy's HTTP/2
			// codec opens by default (256 MiB): grpc-go's client would
			// otherwise send a PING about every round trip to estimate
			// the bandwidth-delay product, which Envoy, the services'
			// real client, never does, and which both services answer.
			grpc.WithStaticStreamWindowSize(envoyWindow), grpc.WithStaticConnWindowSize(envoyWindow))
		if err != nil {
			return err
		}
		defer cc.Close()
		clients = append(clients, cc)
	}
	// One request per key, marshalled once (wire.go): the generator should
	// spend its CPU on the calls, not on building messages.
	reqs := make([]*encodedRequest, o.keys)
	for i := range reqs {
		b, err := proto.Marshal(&rlspb.RateLimitRequest{Domain: o.domain, HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "tokengate_rule", Value: o.rule}, {Key: "key", Value: "k" + strconv.Itoa(i)}},
		}}})
		if err != nil {
			return err
		}
		reqs[i] = &encodedRequest{b}
	}
	// The service must answer before the load starts; a service that
	// fails a call now and then (a Redis timeout) gets a few tries.
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = clients[0].Invoke(ctx, shouldRateLimit, reqs[0], new(overallCode), grpc.WaitForReady(true))
		cancel()
		if err == nil {
			break
		}
		if try == 4 {
			return fmt.Errorf("%s: first call: %w", o.addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if o.warmup > 0 {
		load(o, clients, reqs, o.warmup, 1<<62)
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	svc0, red0, self0 := cpuTime(o.pid), cpuTime(o.redisPid), cpuTime(os.Getpid())
	res := load(o, clients, reqs, o.d, o.n)
	if o.cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	if res.Decisions > 0 {
		res.LoadCPUus = (cpuTime(os.Getpid()) - self0).Seconds() * 1e6 / float64(res.Decisions)
		if o.pid > 0 {
			res.ServiceCPUus = (cpuTime(o.pid) - svc0).Seconds() * 1e6 / float64(res.Decisions)
		}
		if o.redisPid > 0 {
			res.RedisCPUus = (cpuTime(o.redisPid) - red0).Seconds() * 1e6 / float64(res.Decisions)
		}
	}
	return json.NewEncoder(stdout).Encode(res)
}

// load runs o.clients closed loops until n requests were sent or d passed.
func load(o options, clients []*grpc.ClientConn, reqs []*encodedRequest, d time.Duration, n int64) Result {
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
			var code overallCode
			for sent.Add(1) <= n && time.Now().Before(deadline) {
				r := reqs[0]
				if len(reqs) > 1 {
					r = reqs[rng.IntN(len(reqs))]
				}
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
				err := c.Invoke(ctx, shouldRateLimit, r, &code)
				cancel()
				if err != nil {
					errs.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
				if code == overallCode(rlspb.RateLimitResponse_OVER_LIMIT) {
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

// cpuTime is the user + system CPU time of process pid so far, from
// /proc/pid/stat (fields 14 and 15, in clock ticks of 1/100 s, the value of
// USER_HZ on Linux); zero for pid 0 or when unreadable.
func cpuTime(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(ut+st) * 10 * time.Millisecond
}
