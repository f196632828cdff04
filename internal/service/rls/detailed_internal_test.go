package rls

import (
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tokengate/tokengate/config"
)

// TestDetailedHammer: goroutines counting detailed decisions for distinct
// and shared descriptors at once never make more than the cap's
// descriptors, and lose no decision (run it with -race).
func TestDetailedHammer(t *testing.T) {
	const p, n, capN = 8, 2000, 100
	m := NewMetrics(&Config{File: &config.Config{}})
	m.SetDetailedLimit(capN)
	r := &config.Rule{Name: "edge.user"}
	var wg sync.WaitGroup
	for g := range p {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				desc := "edge.user_" + strconv.Itoa(i%(capN/2)) // shared by every goroutine
				if i%2 == 1 {
					desc = "edge.user_g" + strconv.Itoa(g) + "_" + strconv.Itoa(i) // its own
				}
				m.decisionDetailed(r, desc, codeOK, 1)
			}
		}()
	}
	wg.Wait()
	descs := map[string]bool{}
	var total float64
	for _, line := range strings.Split(m.String(), "\n") {
		if !strings.HasPrefix(line, "tokengate_rls_detailed_decisions_total{") {
			continue
		}
		_, d, _ := strings.Cut(line, `descriptor="`)
		d, _, _ = strings.Cut(d, `"`)
		descs[d] = true
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatal(err)
		}
		total += v
	}
	if len(descs) != capN+1 {
		t.Errorf("%d descriptors with series, want the cap %d and the overflow", len(descs), capN)
	}
	if total != p*n {
		t.Errorf("%v decisions counted, want %d", total, p*n)
	}
}
