// Command report prints the one table of `make bench` (bench/run.sh) as
// Markdown, from the raw outputs run.sh leaves in a directory: Go benchmark
// output (go-*.txt; the median of repeated runs is shown), wrk output
// (http-*.txt), redis-benchmark CSV (redis-*.csv), rlsload JSON lines
// (rls-*.json: tokengate-rls and envoyproxy/ratelimit), bench/v8/bench.mjs
// JSON (v8-*.json, one per round: the V8 rows), module
// sizes (size.txt) and the machine (machine.txt). Missing inputs give
// "not measured" rows. BENCHMARKS.md explains every row.
//
//	go run ./bench/report -dir build/bench
package main

import (
	"bufio"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

func main() {
	dir := flag.String("dir", "build/bench", "directory with run.sh's raw outputs")
	flag.Parse()
	r := &report{dir: *dir, bench: map[string]map[string][]float64{}}
	if err := r.load(); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
	r.print(os.Stdout)
}

type report struct {
	dir   string
	bench map[string]map[string][]float64 // benchmark name → unit → values
}

// benchLine matches "BenchmarkX/y-2   1000   123 ns/op   4.0 unit ...".
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

func (r *report) load() error {
	files, err := filepath.Glob(filepath.Join(r.dir, "go-*.txt"))
	if err != nil {
		return err
	}
	for _, f := range files {
		tag := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "go-"), ".txt")
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			m := benchLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			name := m[1]
			if tag == "memory-100k" || tag == "memory-1m" || strings.HasPrefix(tag, "zerohost-") {
				name += "@" + tag
			}
			f := strings.Fields(m[2])
			for i := 0; i+1 < len(f); i += 2 {
				v, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					continue
				}
				if r.bench[name] == nil {
					r.bench[name] = map[string][]float64{}
				}
				r.bench[name][f[i+1]] = append(r.bench[name][f[i+1]], v)
			}
		}
	}
	return nil
}

// get returns the median of a benchmark's unit, and whether it was measured.
func (r *report) get(name, unit string) (float64, bool) {
	vs := r.bench[name][unit]
	if len(vs) == 0 {
		return 0, false
	}
	return median(vs), true
}

// median returns the median of vs (not empty).
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r *report) file(name string) string {
	b, err := os.ReadFile(filepath.Join(r.dir, name))
	if err != nil {
		return ""
	}
	return string(b)
}

// row is one line of the table.
type row struct{ id, what, result, ratio, target string }

func (r *report) print(w io.Writer) {
	var rows []row
	add := func(id, what, result, ratio, target string) {
		rows = append(rows, row{id, what, result, ratio, target})
	}
	na := notMeasured

	// 1. bucket vs x/time/rate.
	take, okT := r.get("BenchmarkTake", "ns/op")
	xt, okX := r.get("BenchmarkXTimeRateAllowN", "ns/op")
	if okT {
		a, _ := r.get("BenchmarkTake", "allocs/op")
		ratio := ""
		if okX {
			ratio = fmt.Sprintf("%.2f× x/time/rate", take/xt)
		}
		add("1", "bucket.Limit.Take", fmt.Sprintf("%s ns/op, %s allocs/op", f3(take), f0(a)), ratio, "0 allocs, < 1×")
	} else {
		add("1", "bucket.Limit.Take", na, "", "")
	}
	if okX {
		a, _ := r.get("BenchmarkXTimeRateAllowN", "allocs/op")
		add("1", "x/time/rate Limiter.AllowN (mutex included)", fmt.Sprintf("%s ns/op, %s allocs/op", f3(xt), f0(a)), "1.00×", "")
	}

	// 2. sharedstate.
	for _, c := range []struct{ name, what string }{
		{"BenchmarkTakeAll/serial", "TakeAll, serial, 1 bucket"},
		{"BenchmarkTakeAll/serial-3-buckets", "TakeAll, serial, 3 buckets"},
		{"BenchmarkTakeAll/parallel-8-one-key", "TakeAll, 8 goroutines, one key, no back-off"},
		{"BenchmarkTakeAll/parallel-8-one-key-spin-backoff", "TakeAll, 8 goroutines, one key, spin back-off"},
		{"BenchmarkTakeAll/parallel-8-10000-keys", "TakeAll, 8 goroutines, 10,000 keys"},
	} {
		ns, ok := r.get(c.name, "ns/op")
		if !ok {
			add("2", c.what, na, "", "")
			continue
		}
		a, _ := r.get(c.name, "allocs/op")
		res := fmt.Sprintf("%s ns/op, %s allocs/op", f0(ns), f0(a))
		if cr, ok := r.get(c.name, "casretries/op"); ok {
			fo, _ := r.get(c.name, "failopen/op")
			res += fmt.Sprintf(", %s CAS retries/op, %s fail-open/op", f3(cr), f3(fo))
		}
		add("2", c.what, res, fmt.Sprintf("%s decisions/s", si(1e9/ns)), "")
	}

	// 3. The module in wazero.
	cases := []struct{ id, name, what string }{
		{"3a", "a-passthrough", "passthrough (no rule applies)"},
		{"3b", "b-one-rule", "one per-IP rule, allowed"},
		{"3c", "c-four-rules", "four rules, allowed"},
		{"3d", "d-rejected", "one rule, rejected (429)"},
		{"3e", "e-100000-ips", "one per-IP rule over 100,000 IPs"},
	}
	pass, okPass := r.get("BenchmarkGuestRequest/a-passthrough", "ns/op")
	if ns, ok := r.get("BenchmarkGuestRequest/o-no-filter", "ns/op"); ok {
		ratio := ""
		if okPass {
			ratio = fmt.Sprintf("%.2f× (a)", ns/pass)
		}
		add("3o", "wasm request: no filter (a module that does nothing, through the same host)", fmt.Sprintf("%s ns/req", f0(ns)), ratio, "")
	}
	for _, c := range cases {
		name := "BenchmarkGuestRequest/" + c.name
		ns, ok := r.get(name, "ns/op")
		if !ok {
			add(c.id, "wasm request: "+c.what, na, "", "")
			continue
		}
		hc, _ := r.get(name, "hostcalls/op")
		gb, _ := r.get(name, "guestB/op")
		ga, _ := r.get(name, "guestallocs/op")
		res := fmt.Sprintf("%s ns/req, %s host calls/req, guest heap %s B/req in %s allocs/req", f0(ns), f2(hc), f0(gb), f2(ga))
		ratio, target := "", ""
		if okPass {
			ratio = fmt.Sprintf("%.2f× (a)", ns/pass)
		}
		if c.id == "3b" {
			target = "≤ 3× (a)"
		}
		add(c.id, "wasm request: "+c.what, res, ratio, target)
	}
	r.v8Rows(add, cases)
	for _, c := range []struct{ id, name, what string }{
		{"3o", "o-no-filter", "no filter (a module that does nothing)"},
		{"3a", "a-passthrough", "passthrough"},
		{"3b", "b-one-rule", "one rule, allowed"},
		{"3c", "c-four-rules", "four rules, allowed"},
		{"3d", "d-rejected", "rejected"},
		{"3e", "e-100000-ips", "one rule over 100,000 IPs"},
	} {
		name := "BenchmarkHostShare/" + c.name
		if h, ok := r.get(name, "hostfn-ns/op"); ok {
			g, _ := r.get(name, "guest-ns/op")
			add(c.id+"′", "split of ("+c.id[1:]+"), "+c.what+": inside host functions / the rest",
				fmt.Sprintf("%s ns / %s ns", f0(h), f0(g)), fmt.Sprintf("%.0f%% host", 100*h/(h+g)), "")
		}
	}
	for _, c := range []struct{ id, name, what string }{
		{"3a", "a-passthrough", "passthrough"},
		{"3b", "b-one-rule", "one rule, allowed"},
		{"3d", "d-rejected", "rejected"},
	} {
		name := "BenchmarkZeroCostHost/" + c.name
		w, okw := r.get(name+"@zerohost-wasm", "ns/op")
		n, okn := r.get(name+"@zerohost-native", "ns/op")
		if !okw && !okn {
			continue
		}
		a, _ := r.get(name+"@zerohost-native", "allocs/op")
		res := fmt.Sprintf("native %s ns, %s allocs", f3(n), f0(a))
		ratio := ""
		if okw {
			res = fmt.Sprintf("wasm %s ns; ", f0(w)) + res
			if okn {
				ratio = fmt.Sprintf("wasm %.1f× native", w/n)
			}
		}
		add(c.id+"″", "filter code only, zero-cost host: "+c.what, res, ratio, "")
	}
	if s, ok := r.get("BenchmarkGuestMemory@memory-1m", "linmem-start-MiB"); ok {
		e, _ := r.get("BenchmarkGuestMemory@memory-1m", "linmem-end-MiB")
		gs, _ := r.get("BenchmarkGuestMemory@memory-1m", "goruntime-start-MiB")
		ge, _ := r.get("BenchmarkGuestMemory@memory-1m", "goruntime-end-MiB")
		add("3f", "guest memory over 1,000,000 requests (100,000 IPs, 10% rejected)",
			fmt.Sprintf("linear memory %s → %s MiB; Go runtime %s → %s MiB", f2(s), f2(e), f2(gs), f2(ge)),
			fmt.Sprintf("%.2f× start", e/s), "flat")
	} else {
		add("3f", "guest memory over 1,000,000 requests", na, "", "flat")
	}

	// 4. HTTP.
	a := wrkRuns(r.dir, "http-a-")
	b := wrkRuns(r.dir, "http-b-")
	if o := wrkRuns(r.dir, "http-o-"); len(o) > 0 && len(a) > 0 {
		mo := medianWrk(o)
		add("4o", "HTTP via tokengate-local -no-filter: the same server and upstream, no module (wrk)", mo.String(),
			fmt.Sprintf("(4a) is %.0f%% of it", 100*medianWrk(a).rps/mo.rps), "")
	}
	if len(a) > 0 && len(b) > 0 {
		ma, mb := medianWrk(a), medianWrk(b)
		add("4a", "HTTP via tokengate-local: passthrough, the module with no policy matching (wrk)", ma.String(), "1.00×", "")
		add("4b", "HTTP via tokengate-local: one per-IP rule (wrk)", mb.String(), fmt.Sprintf("%.0f%% of (4a) req/s", 100*mb.rps/ma.rps), "≥ 90%")
	} else {
		add("4", "HTTP via tokengate-local (wrk)", na+" (no wrk)", "", "≥ 90%")
	}

	// 5. Contention.
	if m, ok := r.get("BenchmarkContention", "cas-attempts-mean"); ok {
		p99, _ := r.get("BenchmarkContention", "cas-attempts-p99")
		mx, _ := r.get("BenchmarkContention", "cas-attempts-max")
		fo, _ := r.get("BenchmarkContention", "fail-open")
		ns, _ := r.get("BenchmarkContention", "ns/op")
		add("5", "contention: 8 worker VMs, one hot key, 100,000 requests",
			fmt.Sprintf("CAS attempts/req mean %s, p99 %s, max %s; fail_open %s", f3(m), f0(p99), f0(mx), f0(fo)),
			fmt.Sprintf("%s decisions/s", si(1e9/ns)), "fail_open 0, mean < 1.5")
	} else {
		add("5", "contention", na, "", "fail_open 0, mean < 1.5")
	}

	// 6. Redis peer.
	for _, c := range []struct{ file, what string }{
		{"redis-keys.csv", "Redis Lua token bucket (EVALSHA), 100,000 keys"},
		{"redis-hot.csv", "Redis Lua token bucket (EVALSHA), one hot key"},
	} {
		rps, p50, p99, ok := redisCSV(filepath.Join(r.dir, c.file))
		if !ok {
			add("6", c.what, na+" (no redis-server)", "", "")
			continue
		}
		ratio := ""
		if okb := r.bench["BenchmarkGuestRequest/b-one-rule"]; okb != nil {
			ns, _ := r.get("BenchmarkGuestRequest/b-one-rule", "ns/op")
			ratio = fmt.Sprintf("tokengate (3b) %s/s per VM", si(1e9/ns))
		}
		add("6", c.what, fmt.Sprintf("%s checks/s, p50 %s ms, p99 %s ms", si(rps), p50, p99), ratio, "")
	}

	// 7. Module.
	sizes := map[string]float64{}
	for _, line := range strings.Split(r.file("size.txt"), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "size" {
			v, _ := strconv.ParseFloat(f[2], 64)
			sizes[f[1]] = v
		}
	}
	for _, c := range []struct{ key, what string }{
		{"default", "module size, `make build`"},
		{"stripped", "module size, -ldflags='-s -w'"},
		{"wasm-opt", "module size, -s -w + wasm-opt -Oz (`make build-small`)"},
	} {
		if v, ok := sizes[c.key]; ok {
			add("7", c.what, fmt.Sprintf("%.2f MB (%s bytes)", v/1e6, f0(v)), "", "≤ 3 MiB")
		}
	}
	if ns, ok := r.get("BenchmarkInstantiateWorker", "ns/op"); ok {
		lm, _ := r.get("BenchmarkInstantiateWorker", "linmem-MiB")
		add("7", "instantiate + start one more worker VM", fmt.Sprintf("%s ms, linear memory %s MiB", f2(ns/1e6), f2(lm)), "", "")
	}
	if e, ok := r.get("BenchmarkGuestMemory@memory-100k", "linmem-end-MiB"); ok {
		add("7", "linear memory per VM after 100,000 requests", fmt.Sprintf("%s MiB", f2(e)), "", "")
	}

	// 8. Rate-limit services, side by side on one Redis.
	for _, keys := range []string{"1", "10000", "c1"} {
		what := "one hot key"
		switch keys {
		case "10000":
			what = "10,000 keys"
		case "c1":
			what = "one client, 10,000 keys"
		}
		tg := rlsRuns(r.dir, "rls-tokengate-"+keys+"-")
		ev := rlsRuns(r.dir, "rls-envoy-"+keys+"-")
		if len(tg) == 0 && len(ev) == 0 {
			add("8", "RLS ShouldRateLimit, "+what+" (bench/cmd/rlsload)", na+" (no redis-server or no tokengate-rls)", "", "")
			continue
		}
		var mt, me rlsResult
		if len(ev) > 0 {
			me = medianRLS(ev)
			add("8", "envoyproxy/ratelimit (fixed window), "+what+" (rlsload)", me.String(), "1.00×", "")
		}
		if len(tg) > 0 {
			mt = medianRLS(tg)
			ratio := ""
			if me.PerSecond > 0 {
				ratio = fmt.Sprintf("%.2f× decisions/s, p99 %.2f×", mt.PerSecond/me.PerSecond, mt.P99us/me.P99us)
				if mt.ServiceCPUus > 0 && me.ServiceCPUus > 0 {
					ratio += fmt.Sprintf(", service CPU %.2f×", mt.ServiceCPUus/me.ServiceCPUus)
				}
			}
			target := "≥ 2×, p99 ≤ 1×"
			if keys == "c1" {
				target = ""
			}
			add("8", "tokengate-rls (token bucket), "+what+" (rlsload)", mt.String(), ratio, target)
		}
	}
	if c := wrkRuns(r.dir, "http-c-"); len(c) > 0 {
		mc := medianWrk(c)
		ratio := ""
		if b := wrkRuns(r.dir, "http-l-"); len(b) > 0 {
			mb := medianWrk(b)
			add("8l", "HTTP via tokengate-local: one per-IP rule, scope local (wrk, same run as 8c)", mb.String(), "1.00×", "")
			ratio = fmt.Sprintf("p50 %+.3f ms, p99 %+.3f ms; %.0f%% of (8l) req/s", mc.p50-mb.p50, mc.p99-mb.p99, 100*mc.rps/mb.rps)
		}
		add("8c", "HTTP via tokengate-local: the same rule, scope cluster (tokengate-rls on Redis) (wrk)", mc.String(), ratio, "")
	}
	if m := wrkRuns(r.dir, "http-m-"); len(m) > 0 {
		mm := medianWrk(m)
		ratio := ""
		if b := wrkRuns(r.dir, "http-l-"); len(b) > 0 {
			mb := medianWrk(b)
			ratio = fmt.Sprintf("%.2f× the per-request cost of (8l) (req/s); p50 +%s ms, p99 +%s ms", mb.rps/mm.rps, f3(mm.p50-mb.p50), f3(mm.p99-mb.p99))
		}
		add("8m", "HTTP via tokengate-local: the same rule, cluster scope in lease mode (wrk)", mm.String(), ratio, "≤ 1.2× (8l)")
		if lc, ok := leaseCalls(r.dir, "http-m-"); ok {
			res := fmt.Sprintf("%.1f calls/s", lc.steady)
			if lo, ok := leaseCalls(r.dir, "http-mq-"); ok {
				if mq := wrkRuns(r.dir, "http-mq-"); len(mq) > 0 {
					res = fmt.Sprintf("%.1f calls/s at %.1f k req/s; %.1f calls/s at %.1f k req/s (-c %d)", lc.steady, mm.rps/1000, lo.steady, medianWrk(mq).rps/1000, lo.conns)
				}
			}
			add("8m'", fmt.Sprintf("RLS calls a second for the hot key during (8m), from %.1f s in (one proxy, lease_tick_ms 100)", lc.coldSecs), res, "", "≤ processes / tick = 10/s, not growing with req/s")
			add("8m''", fmt.Sprintf("RLS calls for the hot key in the first %.1f s of (8m), from cold (released while idle)", lc.coldSecs), fmt.Sprintf("%.0f calls", lc.cold), "", "bounded (an exact take, then the first lease and its doublings to lease_max)")
		}
		total := int(mm.rps * secsOf(r.dir, "http-m-"))
		add("8m-w", "wrong rejections during (8m): non-2xx with the limit never reached (one proxy)", fmt.Sprintf("%d of about %d requests", mm.non2xx, total), "", "≤ (N-1) × lease_max = 0")
	}

	fmt.Fprintln(w, "| # | measurement | result | ratio | target |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, x := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", x.id, x.what, x.result, x.ratio, x.target)
	}
	fmt.Fprintln(w)
	for _, line := range strings.Split(strings.TrimSpace(r.file("machine.txt")), "\n") {
		if line != "" {
			fmt.Fprintln(w, "- "+line)
		}
	}
}

// rlsResult is one rlsload run (its JSON line).
type rlsResult struct {
	PerSecond float64 `json:"per_second"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	Errors    int64   `json:"errors"`
	Decisions int64   `json:"decisions"`
	Clients   int     `json:"clients"`
	// CPU per decision, µs: the service's, Redis's and the load
	// generator's own (which the services do not get meanwhile).
	ServiceCPUus float64 `json:"service_cpu_us"`
	RedisCPUus   float64 `json:"redis_cpu_us"`
	LoadCPUus    float64 `json:"load_cpu_us"`
}

func (x rlsResult) String() string {
	clients := strconv.Itoa(x.Clients) + " clients"
	if x.Clients == 1 {
		clients = "1 client"
	}
	s := fmt.Sprintf("%s decisions/s, p50 %s ms, p99 %s ms (%s)", si(x.PerSecond), f3(x.P50us/1e3), f3(x.P99us/1e3), clients)
	if x.ServiceCPUus > 0 {
		s += fmt.Sprintf("; CPU per decision: service %.0f µs, Redis %.0f µs", x.ServiceCPUus, x.RedisCPUus)
		if x.LoadCPUus > 0 {
			s += fmt.Sprintf(", rlsload %.0f µs", x.LoadCPUus)
		}
	}
	if x.Errors > 0 {
		s += fmt.Sprintf(", %d errors", x.Errors)
	}
	return s
}

// rlsRuns reads the rlsload results dir/prefix*.json, one per round.
func rlsRuns(dir, prefix string) []rlsResult {
	files, _ := filepath.Glob(filepath.Join(dir, prefix+"*.json"))
	var out []rlsResult
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var x rlsResult
		if json.Unmarshal(b, &x) == nil && x.Decisions > 0 {
			out = append(out, x)
		}
	}
	return out
}

// medianRLS is the round with the median decisions/s (its latencies with it).
func medianRLS(rs []rlsResult) rlsResult {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b rlsResult) int { return cmp.Compare(a.PerSecond, b.PerSecond) })
	return s[len(s)/2]
}

// wrkResult is one wrk run.
type wrkResult struct {
	rps, p50, p99 float64 // requests/s, latency in ms
	non2xx        int
}

func (w wrkResult) String() string {
	s := fmt.Sprintf("%s req/s, p50 %s ms, p99 %s ms", si(w.rps), f3(w.p50), f3(w.p99))
	if w.non2xx > 0 {
		s += fmt.Sprintf(", %d non-2xx", w.non2xx)
	}
	return s
}

var (
	wrkRPS     = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkPct     = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$`)
	wrkNon2xx  = regexp.MustCompile(`Non-2xx or 3xx responses:\s+(\d+)`)
	unitToMSec = map[string]float64{"us": 1e-3, "ms": 1, "s": 1e3}
)

func wrkRuns(dir, prefix string) []wrkResult {
	files, _ := filepath.Glob(filepath.Join(dir, prefix+"*.txt"))
	var out []wrkResult
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		m := wrkRPS.FindSubmatch(b)
		if m == nil {
			continue
		}
		var res wrkResult
		res.rps, _ = strconv.ParseFloat(string(m[1]), 64)
		for _, p := range wrkPct.FindAllSubmatch(b, -1) {
			v, _ := strconv.ParseFloat(string(p[2]), 64)
			v *= unitToMSec[string(p[3])]
			if string(p[1]) == "50" {
				res.p50 = v
			} else {
				res.p99 = v
			}
		}
		if n := wrkNon2xx.FindSubmatch(b); n != nil {
			res.non2xx, _ = strconv.Atoi(string(n[1]))
		}
		out = append(out, res)
	}
	return out
}

// medianWrk returns the run with the median throughput.
func medianWrk(rs []wrkResult) wrkResult {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b wrkResult) int { return int(math.Copysign(1, a.rps-b.rps)) })
	return s[len(s)/2]
}

func redisCSV(path string) (rps float64, p50, p99 string, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", "", false
	}
	defer f.Close()
	recs, err := csv.NewReader(bufio.NewReader(f)).ReadAll()
	if err != nil || len(recs) < 2 {
		return 0, "", "", false
	}
	h, v := recs[0], recs[len(recs)-1]
	col := func(name string) string {
		for i, n := range h {
			if n == name && i < len(v) {
				return v[i]
			}
		}
		return ""
	}
	rps, err = strconv.ParseFloat(col("rps"), 64)
	return rps, col("p50_latency_ms"), col("p99_latency_ms"), err == nil
}

func f0(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// f3 prints three significant digits.
func f3(v float64) string {
	switch {
	case v >= 100:
		return f0(v)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return f2(v)
}

// si prints a rate with a k or M suffix.
func si(v float64) string {
	switch {
	case v >= 1e6:
		return f3(v/1e6) + " M"
	case v >= 1e3:
		return f3(v/1e3) + " k"
	}
	return f3(v)
}

const notMeasured = "not measured"

// v8Case is one case of bench/v8/bench.mjs's output (v8-N.json).
type v8Case struct {
	NsPerReq      float64 `json:"nsPerReq"`
	CPUNsPerReq   float64 `json:"cpuNsPerReq"` // the process's CPU time: what a loaded machine disturbs least
	TimedNsPerReq float64 `json:"timedNsPerReq"`
	HostNs        float64 `json:"hostNs"` // less the timer's own cost
	HostCalls     float64 `json:"hostCalls"`
	GuestNs       float64 `json:"guestNs"` // NsPerReq less HostNs and the no-filter row
}

// v8Runs reads bench/v8/bench.mjs's outputs, dir/v8*.json (run.sh runs it once
// per round, between the rounds of the wazero benchmark), and returns each
// case's medians over them, and the node version.
func v8Runs(dir string) (map[string]v8Case, string, error) {
	files, _ := filepath.Glob(filepath.Join(dir, "v8*.json"))
	if len(files) == 0 {
		return nil, "", errors.New("no node")
	}
	var node string
	runs := map[string][]v8Case{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, "", err
		}
		var out struct {
			Node  string            `json:"node"`
			Cases map[string]v8Case `json:"cases"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, "", fmt.Errorf("%s: %v", filepath.Base(f), err)
		}
		node = out.Node
		for name, c := range out.Cases {
			runs[name] = append(runs[name], c)
		}
	}
	med := func(cs []v8Case, f func(v8Case) float64) float64 {
		v := make([]float64, len(cs))
		for i, c := range cs {
			v[i] = f(c)
		}
		return median(v)
	}
	cases := map[string]v8Case{}
	for name, cs := range runs {
		cases[name] = v8Case{
			NsPerReq:      med(cs, func(c v8Case) float64 { return c.NsPerReq }),
			CPUNsPerReq:   med(cs, func(c v8Case) float64 { return c.CPUNsPerReq }),
			TimedNsPerReq: med(cs, func(c v8Case) float64 { return c.TimedNsPerReq }),
			HostNs:        med(cs, func(c v8Case) float64 { return c.HostNs }),
			HostCalls:     med(cs, func(c v8Case) float64 { return c.HostCalls }),
			GuestNs:       med(cs, func(c v8Case) float64 { return c.GuestNs }),
		}
	}
	return cases, node, nil
}

// v8Rows adds the V8 rows (3v…): each case's median ns/request under V8,
// its ratio to V8's passthrough and to the same case in wazero (measured
// in alternating rounds by run.sh), the time inside the JavaScript host's
// functions and what is left for the guest.
func (r *report) v8Rows(add func(id, what, res, ratio, target string), cases []struct{ id, name, what string }) {
	v8, node, err := v8Runs(r.dir)
	if err != nil {
		add("3v", "V8 (node --no-liftoff)", notMeasured+" ("+err.Error()+")", "", "")
		return
	}
	pass := v8["a-passthrough"].NsPerReq
	if o, ok := v8["o-no-filter"]; ok {
		ratio := ""
		if pass > 0 {
			ratio = fmt.Sprintf("%.2f× V8 (a)", o.NsPerReq/pass)
		}
		add("3vo", "V8 "+node+": no filter (a module that does nothing, through the same JS host)", v8ns(o), ratio, "")
	}
	for _, c := range cases {
		v, ok := v8[c.name]
		if !ok {
			continue
		}
		ratio := ""
		if pass > 0 {
			ratio = fmt.Sprintf("%.2f× V8 (a)", v.NsPerReq/pass)
		}
		if w, ok := r.get("BenchmarkGuestRequest/"+c.name, "ns/op"); ok {
			ratio += fmt.Sprintf(", %.2f× wazero", v.NsPerReq/w)
		}
		res := v8ns(v)
		if v.TimedNsPerReq > 0 {
			res += fmt.Sprintf("; host functions %s ns (%.0f%%), guest %s ns (%.0f%%), %s host calls", f0(v.HostNs),
				100*v.HostNs/v.NsPerReq, f0(v.GuestNs), 100*v.GuestNs/v.NsPerReq, f2(v.HostCalls))
		}
		target := ""
		if c.id == "3b" {
			target = "≤ 2.5× V8 (a), ≤ 3.5 µs"
		}
		add(strings.Replace(c.id, "3", "3v", 1), "V8 request: "+c.what, res, ratio, target)
	}
}

// v8ns is a V8 case's ns/request, wall and CPU.
func v8ns(c v8Case) string {
	if c.CPUNsPerReq > 0 {
		return fmt.Sprintf("%s ns/req (CPU %s)", f0(c.NsPerReq), f0(c.CPUNsPerReq))
	}
	return f0(c.NsPerReq) + " ns/req"
}

// leaseRound is what a lease-mode round's .calls file says: the RLS calls
// in its first coldSecs (cold) and a second after that (steady), at conns
// connections.
type leaseRound struct {
	cold, steady, coldSecs float64
	conns                  int
}

// leaseCalls returns the medians of the lease rounds' RLS calls
// (PREFIXN.calls: "before mid after seconds cold-seconds connections").
func leaseCalls(dir, prefix string) (leaseRound, bool) {
	files, _ := filepath.Glob(filepath.Join(dir, prefix+"*.calls"))
	var cold, steady []float64
	var out leaseRound
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var before, mid, after, secs, coldSecs float64
		var conns int
		if n, _ := fmt.Sscan(string(b), &before, &mid, &after, &secs, &coldSecs, &conns); n == 6 && secs > coldSecs {
			cold = append(cold, mid-before)
			steady = append(steady, (after-mid)/(secs-coldSecs))
			out.coldSecs, out.conns = coldSecs, conns
		}
	}
	if len(cold) == 0 {
		return out, false
	}
	sort.Float64s(cold)
	sort.Float64s(steady)
	out.cold, out.steady = cold[len(cold)/2], steady[len(steady)/2]
	return out, true
}

// secsOf returns the seconds of the first lease round (its .calls file), 0
// if none.
func secsOf(dir, prefix string) float64 {
	files, _ := filepath.Glob(filepath.Join(dir, prefix+"*.calls"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		var before, mid, after, secs float64
		if n, _ := fmt.Sscan(string(b), &before, &mid, &after, &secs); n == 4 {
			return secs
		}
	}
	return 0
}
