package sharedstate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/bucket"
)

// The single-request path of TakeAll (and readSlot's inline
// first look) against the general path (TakeAll given a results slice too
// short, and readSlot as it was: lookSlot, mine, use), on the same random stores, faults and contention: every
// outcome, request field, result, store call and stored byte must match.

// traceStore is a MemStore behind a script of faults drawn from its own
// random source, one draw per call, so that two runs making the same calls
// meet the same faults. It records every call and its answer.
type traceStore struct {
	m      *MemStore
	rng    *rand.Rand
	binary bool // answer BinaryValues true
	trace  []string

	pGetErr, pEvict, pInterfere, pSetErr float64
	interfere                            []string // values another worker writes
}

func (s *traceStore) BinaryValues() bool { return s.binary }

func (s *traceStore) Get(key string) ([]byte, uint32, error) {
	d := s.rng.Float64()
	switch {
	case d < s.pGetErr:
		s.trace = append(s.trace, "get "+key+" -> injected error")
		return nil, 0, errInjected
	case d < s.pGetErr+s.pEvict:
		s.m.Delete(key)
	}
	v, cas, err := s.m.Get(key)
	s.trace = append(s.trace, fmt.Sprintf("get %s -> %q %d %v", key, v, cas, err))
	return v, cas, err
}

func (s *traceStore) Set(key string, value []byte, cas uint32) error {
	d := s.rng.Float64()
	switch {
	case d < s.pSetErr:
		s.trace = append(s.trace, fmt.Sprintf("set %s %q %d -> injected error", key, value, cas))
		return errInjected
	case d < s.pSetErr+s.pInterfere: // another worker writes first
		w := s.interfere[s.rng.IntN(len(s.interfere))]
		_, c, _ := s.m.Get(key)
		_ = s.m.Set(key, []byte(w), c)
		s.trace = append(s.trace, fmt.Sprintf("interfere %s %q", key, w))
	}
	err := s.m.Set(key, value, cas)
	s.trace = append(s.trace, fmt.Sprintf("set %s %q %d -> %v", key, value, cas, err))
	return err
}

var errInjected = errors.New("injected store failure")

// binValue is a binary slot or plain value, built by hand (the wasm build
// reads it as a corrupt text value, the same for both paths).
func binValue(tokens, last float64, owner string, hasOwner bool) string {
	tag := byte(0xfe)
	if hasOwner {
		tag = 0xff
	}
	b := []byte{tag}
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(tokens))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(last))
	if hasOwner {
		b = append(b, owner...)
	}
	return string(b)
}

// scenario is one random configuration: the store's initial values, its
// faults, the request and the updater's settings.
type scenario struct {
	sem        Semantics
	binary     bool
	init       [][2]string // key, value
	seed       uint64
	req        Request
	now        float64
	attempts   int
	backoff    bool
	pGetErr    float64
	pEvict     float64
	pInterfere float64
	pSetErr    float64
	interfere  []string
}

func randomScenario(rng *rand.Rand) scenario {
	sc := scenario{sem: Semantics(rng.IntN(2)), binary: rng.IntN(2) == 0, seed: rng.Uint64()}
	now := t0 + float64(rng.IntN(1000))/7
	sc.now = now
	lims := []bucket.Limit{
		{Rate: 1, Burst: 2},
		{Rate: 1000, Burst: 1000},
		{Rate: 0.5, Burst: 10},
		{Rate: 10, Burst: 5, MaxDebt: 5, Reserve: 3},
		{Rate: 3, Burst: 6, Window: 2},
		{Rate: 1e6, Burst: 1e6},
	}
	lim := lims[rng.IntN(len(lims))]
	costs := []float64{1, 0, 2, 0.5, 3, 7, 1e9, -1}
	owners := []string{"10.0.0.1", "10.0.0.2", "alice", ""}
	owner := owners[rng.IntN(len(owners))]
	sc.req = Request{Key: "tb:r:slot:1", Limit: lim, Cost: costs[rng.IntN(len(costs))]}
	keys := []string{sc.req.Key}
	switch rng.IntN(3) {
	case 0: // unslotted
		sc.req.Key = "tb:r:" + owner
		keys[0] = sc.req.Key
	case 1: // one slot
		sc.req.Slotted, sc.req.Owner = true, owner
	case 2: // two slots
		sc.req.Slotted, sc.req.Owner, sc.req.Alt = true, owner, "tb:r:slot:2"
		keys = append(keys, sc.req.Alt)
	}
	value := func() string {
		tokens := []float64{0, 0.5, 1, 1.999999, 2, 5, 1000, 1e6, -2}[rng.IntN(9)]
		last := []float64{now, now - 0.25, now - 3, now - 1e4, now + 0.5, now + 7200, now + 2*DefaultMaxFuture}[rng.IntN(7)]
		o := owners[rng.IntN(len(owners))]
		switch rng.IntN(8) {
		case 0:
			return enc(tokens, last)
		case 1, 2:
			return string(AppendSlotValue(nil, bucket.State{Tokens: tokens, Last: last}, o))
		case 3:
			return binValue(tokens, Quantize(last), o, true)
		case 4:
			return binValue(tokens, Quantize(last), "", false)
		case 5:
			return []string{"garbage", "", "1:2:3:4", "\xfe\x01", "\xff"}[rng.IntN(5)]
		default:
			return string(AppendSlotValue(nil, bucket.State{Tokens: tokens, Last: last}, sc.req.Owner))
		}
	}
	for _, k := range keys {
		if rng.IntN(4) > 0 {
			sc.init = append(sc.init, [2]string{k, value()})
		}
	}
	for range 3 {
		sc.interfere = append(sc.interfere, value())
	}
	sc.attempts = []int{0, 1, 2, 3}[rng.IntN(4)]
	sc.backoff = rng.IntN(2) == 0
	if rng.IntN(2) == 0 { // faults in half of the scenarios
		sc.pGetErr = []float64{0, 0.02, 0.1}[rng.IntN(3)]
		sc.pEvict = []float64{0, 0.1, 0.3}[rng.IntN(3)]
		sc.pInterfere = []float64{0, 0.3, 0.7}[rng.IntN(3)]
		sc.pSetErr = []float64{0, 0.02, 0.1}[rng.IntN(3)]
	}
	return sc
}

// load writes sc's initial values into m, in order (CAS tokens depend on it).
func (sc scenario) load(m *MemStore) {
	for _, kv := range sc.init {
		_ = m.Set(kv[0], []byte(kv[1]), 0)
	}
}

// run runs sc with fn (either path of TakeAll) for a few consecutive requests
// and returns everything observable, as text.
func (sc scenario) run(fn func(u *Updater, reqs []Request, now float64, res []bucket.Result) Outcome) string {
	m := NewMemStore(sc.sem)
	sc.load(m)
	st := &traceStore{m: m, rng: rand.New(rand.NewPCG(sc.seed, 1)), binary: sc.binary,
		pGetErr: sc.pGetErr, pEvict: sc.pEvict, pInterfere: sc.pInterfere, pSetErr: sc.pSetErr, interfere: sc.interfere}
	var backoffs []int
	u := &Updater{Store: st, MaxAttempts: sc.attempts}
	if sc.backoff {
		u.Backoff = func(n int) { backoffs = append(backoffs, n) }
	}
	var b strings.Builder
	reqs := []Request{sc.req}
	res := make([]bucket.Result, 1)
	for i := range 4 {
		reqs[0].Stored = "stale"
		reqs[0].TookOver, reqs[0].Collided = true, true
		res[0] = bucket.Result{} // as the general path's fresh slice
		out := fn(u, reqs, sc.now+float64(i)*0.3, res)
		errText := "<nil>"
		if out.Err != nil {
			errText = out.Err.Error()
		}
		out.Err = nil
		fmt.Fprintf(&b, "call %d: %+v err=%s\nreq: stored=%q tookover=%v collided=%v\n", i, out, errText,
			reqs[0].Stored, reqs[0].TookOver, reqs[0].Collided)
	}
	fmt.Fprintf(&b, "backoffs %v\n", backoffs)
	for _, line := range st.trace {
		b.WriteString(line + "\n")
	}
	for _, e := range m.Snapshot("") {
		fmt.Fprintf(&b, "stored %s = %q cas %d\n", e.Key, e.Value, e.CAS)
	}
	return b.String()
}

// TestTakeOneEquivalence: TakeAll's single-request path and its
// general path agree on 20,000 random scenarios: Envoy and Kong, text and
// binary stores, missing, own, foreign, full, live, future and corrupt
// values in one or both slots or an unslotted key, rejections, debts,
// fixed windows, injected Get and Set failures, evictions, and another
// worker's writes between a Get and its Set (CAS retries, contention).
func TestTakeOneEquivalence(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 1))
	counts := map[string]int{}
	for i := range 20000 {
		sc := randomScenario(rng)
		fast := sc.run(func(u *Updater, reqs []Request, now float64, res []bucket.Result) Outcome {
			return u.TakeAll(reqs, now, res)
		})
		general := sc.run(func(u *Updater, reqs []Request, now float64, res []bucket.Result) Outcome {
			return u.TakeAll(reqs, now, res[:0]) // too short: the general path
		})
		if fast != general {
			t.Fatalf("scenario %d (%+v):\nsingle-request path:\n%s\ngeneral:\n%s", i, sc, fast, general)
		}
		for _, k := range []string{"Allowed:true", "Rejected:0", "CASRetries:1", "Corrupt:1", "Takeovers:1", "Collisions:1", "err=sharedstate: too much", "err=injected", "interfere"} {
			if strings.Contains(fast, k) {
				counts[k]++
			}
		}
	}
	// The scenarios reach every branch that matters, many times.
	for _, k := range []string{"Allowed:true", "Rejected:0", "CASRetries:1", "Corrupt:1", "Takeovers:1", "Collisions:1", "err=sharedstate: too much", "err=injected", "interfere"} {
		if counts[k] < 100 {
			t.Errorf("only %d scenarios show %q", counts[k], k)
		}
	}
}

// readSlotReference is readSlot before its first candidate was read
// inline: lookSlot, mine and use.
func (u *Updater) readSlotReference(r *Request, now float64, out *Outcome, p *pending) error {
	for seeds := 0; ; seeds++ {
		a, err := u.lookSlot(r.Key, now)
		if err != nil {
			return err
		}
		if a.mine(r) {
			use(p, &a, r.Owner)
			return nil
		}
		b := a
		if r.Alt != "" {
			if b, err = u.lookSlot(r.Alt, now); err != nil {
				return err
			}
			if b.mine(r) {
				use(p, &b, r.Owner)
				return nil
			}
		}
		var pick *slotRead
		switch {
		case a.free(r, now):
			pick = &a
		case b.free(r, now):
			pick = &b
		}
		if pick == nil {
			pick = &a
			if r.Limit.Refill(b.state, now).Tokens > r.Limit.Refill(a.state, now).Tokens {
				pick = &b
			}
			*p = pending{read: r.Limit.Full(now), cas: pick.cas, key: pick.key, owner: r.Owner, hasOwner: true, collide: true}
			return nil
		}
		if pick.exists {
			*p = pending{read: r.Limit.Full(now), cas: pick.cas, corrupt: pick.corrupt,
				key: pick.key, owner: r.Owner, hasOwner: true, takeover: true}
			if pick.corrupt {
				out.Corrupt++
			}
			return nil
		}
		if seeds == u.maxAttempts() {
			return ErrContention
		}
		u.buf = AppendSlotValue(u.buf[:0], r.Limit.Full(now), r.Owner)
		n, err := create(u.Store, pick.key, u.buf)
		out.CASRetries += n
		if err != nil {
			return err
		}
	}
}

// TestReadSlotEquivalence: readSlot and readSlotReference read the same
// slots, in the same order, and fill the same pending and outcome, on the
// random slotted scenarios of TestTakeOneEquivalence.
func TestReadSlotEquivalence(t *testing.T) {
	rng := rand.New(rand.NewPCG(2929, 1))
	n := 0
	for i := 0; n < 10000; i++ {
		sc := randomScenario(rng)
		if !sc.req.Slotted {
			continue
		}
		n++
		var got [2]string
		var gotP [2]pending
		var gotOut [2]Outcome
		for j, read := range []func(u *Updater, r *Request, now float64, out *Outcome, p *pending) error{
			(*Updater).readSlot, (*Updater).readSlotReference,
		} {
			m := NewMemStore(sc.sem)
			sc.load(m)
			st := &traceStore{m: m, rng: rand.New(rand.NewPCG(sc.seed, 1)), pGetErr: sc.pGetErr, pEvict: sc.pEvict}
			u := &Updater{Store: st, MaxAttempts: sc.attempts}
			r := sc.req
			err := read(u, &r, Quantize(sc.now), &gotOut[j], &gotP[j])
			got[j] = fmt.Sprint(err, st.trace)
		}
		if got[0] != got[1] || !reflect.DeepEqual(gotP[0], gotP[1]) || !reflect.DeepEqual(gotOut[0], gotOut[1]) {
			t.Fatalf("scenario %d (%+v):\nreadSlot: %s %+v %+v\nreference: %s %+v %+v", i, sc,
				got[0], gotP[0], gotOut[0], got[1], gotP[1], gotOut[1])
		}
	}
}
