package rls

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// ErrorLog writes error lines through a slog.Logger, at most one per
// interval for each kind of failure: the first at once, the others of the
// same kind within the interval counted and reported by the next line of
// that kind ("suppressed": how many were not written since the last one).
// A failing Redis under load fails thousands of times a second; the log
// says what failed, and how often, in a line per interval.
type ErrorLog struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu    sync.Mutex
	kinds map[string]*errKind
}

type errKind struct {
	last       time.Time
	suppressed uint64
}

// maxErrKinds bounds the kinds an ErrorLog remembers; beyond it, kinds
// not seen for an interval are forgotten.
const maxErrKinds = 1024

// NewErrorLog returns an ErrorLog writing to l at most one line per
// interval and kind; now is its clock (nil: time.Now).
func NewErrorLog(l *slog.Logger, interval time.Duration, now func() time.Time) *ErrorLog {
	if now == nil {
		now = time.Now
	}
	return &ErrorLog{log: l, interval: interval, now: now, kinds: map[string]*errKind{}}
}

// Error logs msg at level error with args unless a line of the same kind
// was written less than an interval ago, in which case it is counted.
func (e *ErrorLog) Error(msg, kind string, args ...any) {
	t := e.now()
	e.mu.Lock()
	k := e.kinds[kind]
	if k == nil {
		if len(e.kinds) >= maxErrKinds {
			e.forget(t)
		}
		k = &errKind{}
		e.kinds[kind] = k
	} else if t.Sub(k.last) < e.interval {
		k.suppressed++
		e.mu.Unlock()
		return
	}
	n := k.suppressed
	k.last, k.suppressed = t, 0
	e.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	e.log.Log(context.Background(), slog.LevelError, msg, args...)
}

// forget drops the kinds whose last line is an interval old or older, or
// all when none is (e.mu held).
func (e *ErrorLog) forget(t time.Time) {
	for name, k := range e.kinds {
		if t.Sub(k.last) >= e.interval {
			delete(e.kinds, name)
		}
	}
	if len(e.kinds) >= maxErrKinds {
		clear(e.kinds)
	}
}
