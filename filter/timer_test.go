package filter

import (
	"errors"
	"slices"
	"testing"
)

// tickRecorder is a Ticker that records the periods set.
type tickRecorder struct {
	periods []uint32
	err     error
	refused int
}

func (r *tickRecorder) SetTickPeriod(ms uint32) error {
	if r.err != nil {
		r.refused++
		return r.err
	}
	r.periods = append(r.periods, ms)
	return nil
}

// dueLog records the entries dispatched, by name.
type dueLog struct{ got []string }

// testEntry is a timer entry whose owner records its dispatch and may run
// an action then.
type testEntry struct {
	timerEntry
	name string
	log  *dueLog
	on   func(now float64)
}

func (e *testEntry) due(_ *Plugin, now float64) {
	e.log.got = append(e.log.got, e.name)
	if e.on != nil {
		e.on(now)
	}
}

func newTestTimer() (*timer, *tickRecorder, *[]string) {
	rec := &tickRecorder{}
	var logs []string
	t := &timer{ticker: rec, log: logHost{logs: &logs}}
	return t, rec, &logs
}

func (l *dueLog) entry(name string, deadline float64) *testEntry {
	e := &testEntry{name: name, log: l}
	e.deadline, e.owner = deadline, e.due
	return e
}

// logHost is a Host that only logs, into logs.
type logHost struct {
	Host
	logs *[]string
}

func (h logHost) Log(_ LogLevel, msg string) { *h.logs = append(*h.logs, msg) }

const t0 = 1_700_000_000.0 // seconds since the epoch

// TestTimerOrder: one-shot entries are dispatched in deadline order, equal
// deadlines in arming order, each once, never before its deadline.
func TestTimerOrder(t *testing.T) {
	tm, _, _ := newTestTimer()
	var l dueLog
	for _, e := range []*testEntry{
		l.entry("c", t0+0.3), l.entry("a1", t0+0.1), l.entry("b", t0+0.2), l.entry("a2", t0+0.1), l.entry("d", t0+0.4),
	} {
		if !tm.arm(&e.timerEntry, t0) {
			t.Fatalf("arm %s refused", e.name)
		}
	}
	steps := []struct {
		now  float64
		want []string
	}{
		{t0 + 0.1 - 1e-6, nil},
		{t0 + 0.1, []string{"a1", "a2"}},
		{t0 + 0.1, nil},
		{t0 + 0.35, []string{"b", "c"}},
		{t0 + 1, []string{"d"}},
	}
	for i, st := range steps {
		l.got = nil
		tm.dispatch(nil, st.now)
		if !slices.Equal(l.got, st.want) {
			t.Errorf("step %d: got %v, want %v", i, l.got, st.want)
		}
	}
	if len(tm.h) != 0 {
		t.Errorf("%d entries left", len(tm.h))
	}
}

// TestTimerPeriod walks the period the timer sets through arming, ticks,
// removals and periodic entries, as a step table: outside a tick it is set
// only when the entries change; at a tick it follows the time left.
func TestTimerPeriod(t *testing.T) {
	tm, rec, _ := newTestTimer()
	var l dueLog
	slow, fast, late := l.entry("slow", t0+1), l.entry("fast", t0+0.01), l.entry("late", t0+2)
	lease := l.entry("lease", 0)
	steps := []struct {
		name string
		do   func()
		want []uint32 // periods set by the step
	}{
		{"arm the first deadline", func() { tm.arm(&slow.timerEntry, t0) }, []uint32{1000}},
		{"a later deadline leaves it", func() { tm.arm(&late.timerEntry, t0) }, nil},
		{"an earlier one re-arms", func() { tm.arm(&fast.timerEntry, t0+0.001) }, []uint32{9}},
		{"a tick before anything is due", func() { tm.dispatch(nil, t0+0.005) }, []uint32{5}},
		{"a tick that releases fast", func() { tm.dispatch(nil, t0+0.01) }, []uint32{990}},
		{"time passing outside a tick sets nothing", func() { tm.rearm(t0+0.5, false) }, nil},
		{"a periodic entry faster than the time left", func() {
			lease.every = 100
			tm.arm(&lease.timerEntry, t0+0.5)
		}, []uint32{100}},
		{"its period holds at every tick", func() { tm.dispatch(nil, t0+0.6) }, nil},
		{"polled faster", func() {
			lease.every, lease.poll = 1, true
			tm.arm(&lease.timerEntry, t0+0.6)
		}, []uint32{1}},
		{"back to its period", func() {
			lease.every, lease.poll = 100, false
			tm.arm(&lease.timerEntry, t0+0.6)
		}, []uint32{100}},
		{"periodic stopped: the deadline again", func() { tm.stop(&lease.timerEntry, t0+0.7) }, []uint32{300}},
		{"removing the earliest follows the next", func() { tm.stop(&slow.timerEntry, t0+0.7) }, []uint32{1300}},
		{"removing the last stops the tick", func() { tm.stop(&late.timerEntry, t0+0.7) }, []uint32{0}},
		{"stopping an unarmed entry sets nothing", func() { tm.stop(&late.timerEntry, t0+0.7) }, nil},
	}
	for i, st := range steps {
		before := len(rec.periods)
		st.do()
		if got := rec.periods[before:]; !slices.Equal(got, st.want) {
			t.Errorf("step %d (%s): got %v, want %v", i, st.name, got, st.want)
		}
	}
	if tm.period != 0 {
		t.Errorf("period %d at the end, want 0", tm.period)
	}
}

// TestTimerPeriodicFirst: at a tick the periodic entry (lease mode's,
// which makes calls) runs before any one-shot entry (a held request, made
// effective), whatever the deadlines; polled, it runs at every tick, else
// only once its deadline has come. A second periodic entry takes the
// first one's place.
func TestTimerPeriodicFirst(t *testing.T) {
	tm, rec, _ := newTestTimer()
	var l dueLog
	lease := l.entry("lease", t0+0.5)
	lease.every = 100
	lease.on = func(now float64) {
		if now >= lease.deadline {
			lease.deadline = now + 0.09
		}
	}
	tm.arm(&lease.timerEntry, t0)
	tm.arm(&l.entry("held1", t0+0.01).timerEntry, t0)
	poll := func(on bool) func() {
		return func() {
			lease.every, lease.poll = 100, on
			if on {
				lease.every = 1
			}
			tm.arm(&lease.timerEntry, t0)
		}
	}
	steps := []struct {
		before func()
		now    float64
		want   []string
	}{
		{nil, t0 + 0.01, []string{"held1"}},
		{func() { poll(true)(); tm.arm(&l.entry("held2", t0+0.02).timerEntry, t0) }, t0 + 0.02, []string{"lease", "held2"}},
		{nil, t0 + 0.03, []string{"lease"}},
		{poll(false), t0 + 0.04, nil},
		{nil, t0 + 0.5, []string{"lease"}},
		{nil, t0 + 0.55, nil},
		{nil, t0 + 0.59, []string{"lease"}},
	}
	for i, st := range steps {
		if st.before != nil {
			st.before()
		}
		l.got = nil
		tm.dispatch(nil, st.now)
		if !slices.Equal(l.got, st.want) {
			t.Errorf("step %d: got %v, want %v", i, l.got, st.want)
		}
	}
	other := l.entry("other", t0)
	other.every = 50
	tm.arm(&other.timerEntry, t0+0.6)
	if lease.armed() || !other.armed() || tm.period != 50 {
		t.Errorf("second periodic entry: first armed %v, second %v, period %d; want false, true, 50",
			lease.armed(), other.armed(), tm.period)
	}
	if len(rec.periods) == 0 {
		t.Error("no period set")
	}
}

// TestTimerRearmDuringTick: an entry armed while a tick dispatches waits for
// the next tick even when it is due already (no entry runs twice in a
// tick, and a one-shot owner that arms itself again cannot loop); an entry
// stopped by another's owner during the tick is not dispatched.
func TestTimerRearmDuringTick(t *testing.T) {
	tm, _, _ := newTestTimer()
	var l dueLog
	again := l.entry("again", t0+0.1)
	gone := l.entry("gone", t0+0.1)
	fresh := l.entry("fresh", t0)
	again.on = func(now float64) {
		again.deadline = now // due at once: the next tick
		tm.arm(&again.timerEntry, now)
		tm.arm(&fresh.timerEntry, now)
		tm.stop(&gone.timerEntry, now)
	}
	tm.arm(&again.timerEntry, t0)
	tm.arm(&gone.timerEntry, t0)
	tm.dispatch(nil, t0+0.1)
	if want := []string{"again"}; !slices.Equal(l.got, want) {
		t.Fatalf("first tick: got %v, want %v", l.got, want)
	}
	if tm.period != minTickMs {
		t.Errorf("period %d after the tick, want %d for the entries due", tm.period, minTickMs)
	}
	l.got, again.on = nil, nil
	tm.dispatch(nil, t0+0.1)
	if want := []string{"fresh", "again"}; !slices.Equal(l.got, want) {
		t.Errorf("second tick: got %v, want %v (deadline order: fresh is due earlier)", l.got, want)
	}
}

// TestTimerMove: arming an armed entry again moves it to its new deadline.
func TestTimerMove(t *testing.T) {
	tm, rec, _ := newTestTimer()
	var l dueLog
	a, b := l.entry("a", t0+0.1), l.entry("b", t0+0.2)
	tm.arm(&a.timerEntry, t0)
	tm.arm(&b.timerEntry, t0)
	a.deadline = t0 + 0.3
	tm.arm(&a.timerEntry, t0)
	if want := []uint32{100, 200}; !slices.Equal(rec.periods, want) {
		t.Errorf("periods %v, want %v", rec.periods, want)
	}
	tm.dispatch(nil, t0+0.25)
	tm.dispatch(nil, t0+0.3)
	if want := []string{"b", "a"}; !slices.Equal(l.got, want) {
		t.Errorf("got %v, want %v", l.got, want)
	}
}

// TestTimerClockSteppedBack: a clock stepped back by more than
// bucket.MaxClockSkew moves every deadline back by the step, so that the
// entries keep the wait they had left (as held requests did with
// delayQueue.rebase); a smaller step moves nothing.
func TestTimerClockSteppedBack(t *testing.T) {
	tm, rec, _ := newTestTimer()
	var l dueLog
	a, b := l.entry("a", t0+0.1), l.entry("b", t0+0.2)
	p := l.entry("periodic", t0+0.5)
	p.every = 100
	p.on = func(now float64) { p.deadline = now + 10 }
	tm.arm(&a.timerEntry, t0)
	tm.arm(&b.timerEntry, t0)
	tm.arm(&p.timerEntry, t0)
	tm.dispatch(nil, t0+0.05)
	back := t0 - 3600 // an hour back, 50 ms after the last tick
	steps := []struct {
		now  float64
		want []string
	}{
		{back, nil},
		{back + 0.05 + 1e-6, []string{"a"}},
		{back + 0.15 + 1e-6, []string{"b"}},
		{back + 0.45 + 1e-6, []string{"periodic"}},
	}
	for i, st := range steps {
		l.got = nil
		tm.dispatch(nil, st.now)
		if !slices.Equal(l.got, st.want) {
			t.Errorf("step %d: got %v, want %v", i, l.got, st.want)
		}
	}
	// Within the skew, nothing moves: a small step is the clock's jitter.
	c := l.entry("c", back+1)
	tm.arm(&c.timerEntry, back+0.5)
	l.got = nil
	tm.dispatch(nil, back+0.5-0.01)
	tm.dispatch(nil, back+1-1e-6)
	if len(l.got) != 0 {
		t.Errorf("released %v before its deadline after a small step", l.got)
	}
	tm.dispatch(nil, back+1)
	if !slices.Equal(l.got, []string{"c"}) {
		t.Errorf("got %v, want [c] at its deadline", l.got)
	}
	if len(rec.periods) == 0 {
		t.Error("no period set")
	}
}

// TestTimerRefused: a host that refuses a period leaves the entry unarmed,
// is logged once, and is not asked again.
func TestTimerRefused(t *testing.T) {
	tm, rec, logs := newTestTimer()
	rec.err = errors.New("proxy-wasm status 12")
	var l dueLog
	a, b := l.entry("a", t0+0.1), l.entry("b", t0+0.2)
	if tm.arm(&a.timerEntry, t0) {
		t.Fatal("arm reported success on a host that refused the period")
	}
	if a.armed() || len(tm.h) != 0 || tm.usable() {
		t.Fatalf("armed %v, %d entries, usable %v after the refusal; want none", a.armed(), len(tm.h), tm.usable())
	}
	if tm.arm(&b.timerEntry, t0) || rec.refused != 1 || len(*logs) != 1 {
		t.Errorf("second arm: refused %d times, %d logs; want 1 and 1 (not asked again)", rec.refused, len(*logs))
	}
	tm.dispatch(nil, t0+1)
	if len(l.got) != 0 {
		t.Errorf("dispatched %v", l.got)
	}
	// A host without a timer: nothing is armed, nothing logged.
	none := &timer{}
	if none.arm(&a.timerEntry, t0) || a.armed() {
		t.Error("armed an entry on a host without a timer")
	}
}
