package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestV8Rows renders the no-filter and V8 rows from testdata/v8: three
// rounds of bench/v8/bench.mjs (v8-1..3.json) and two of the wazero benchmark. Every
// figure is the median over the rounds, each ratio divides medians.
func TestV8Rows(t *testing.T) {
	r := &report{dir: "testdata/v8", bench: map[string]map[string][]float64{}}
	if err := r.load(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r.print(&out)
	var got []string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "| 3v") || strings.HasPrefix(line, "| 3o ") {
			got = append(got, line)
		}
	}
	want := []string{
		"| 3o | wasm request: no filter (a module that does nothing, through the same host) | 1100 ns/req | 0.35× (a) |  |",
		"| 3vo | V8 v20.0.0: no filter (a module that does nothing, through the same JS host) | 600 ns/req (CPU 590) | 0.38× V8 (a) |  |",
		"| 3va | V8 request: passthrough (no rule applies) | 1600 ns/req (CPU 1590); host functions 100 ns (6%), guest 900 ns (56%), 1.00 host calls | 1.00× V8 (a), 0.52× wazero |  |",
		"| 3vb | V8 request: one per-IP rule, allowed | 4000 ns/req (CPU 3990); host functions 1000 ns (25%), guest 2400 ns (60%), 11.00 host calls | 2.50× V8 (a), 0.47× wazero | ≤ 2.5× V8 (a), ≤ 3.5 µs |",
		"| 3vc | V8 request: four rules, allowed | 8000 ns/req (CPU 7990); host functions 2000 ns (25%), guest 5400 ns (68%), 23.00 host calls | 5.00× V8 (a) |  |",
		"| 3vd | V8 request: one rule, rejected (429) | 9000 ns/req (CPU 8990); host functions 3000 ns (33%), guest 5400 ns (60%), 7.00 host calls | 5.62× V8 (a) |  |",
		"| 3ve | V8 request: one per-IP rule over 100,000 IPs | 7000 ns/req (CPU 6990); host functions 3500 ns (50%), guest 2900 ns (41%), 11.50 host calls | 4.38× V8 (a) |  |",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("V8 rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestV8RowsMissing: without bench/v8/bench.mjs's output the table says so.
func TestV8RowsMissing(t *testing.T) {
	r := &report{dir: t.TempDir(), bench: map[string]map[string][]float64{}}
	var out bytes.Buffer
	r.print(&out)
	if !strings.Contains(out.String(), "| 3v | V8 (node --no-liftoff) | not measured (no node) |") {
		t.Errorf("no 'not measured' V8 row:\n%s", out.String())
	}
}
