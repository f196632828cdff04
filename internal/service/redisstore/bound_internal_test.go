package redisstore

import (
	"context"
	"testing"
	"time"
)

// TestBound: a Redis round trip runs under the caller's context when that
// ends within the timeout or has ended, and otherwise under a context
// ending between one timeout and one timeout plus deadlineSlack from its
// start, shared by the calls of that interval.
func TestBound(t *testing.T) {
	const timeout = 25 * time.Millisecond
	s := &Store{opt: Options{Timeout: timeout}}
	now := time.Now()

	short, cancel := context.WithDeadline(context.Background(), now.Add(timeout/2))
	defer cancel()
	if got, _ := s.bound(short, now); got != short {
		t.Error("a caller's deadline within the timeout: not the caller's context")
	}
	gone, cancelGone := context.WithCancel(context.Background())
	cancelGone()
	if got, _ := s.bound(gone, now); got != gone {
		t.Error("a caller that gave up: not its context (the call should fail at once)")
	}

	long, cancelLong := context.WithDeadline(context.Background(), now.Add(time.Hour))
	defer cancelLong()
	first, _ := s.bound(long, now)
	dl, ok := first.Deadline()
	if !ok || dl.Before(now.Add(timeout)) || dl.After(now.Add(timeout+deadlineSlack)) {
		t.Fatalf("deadline %v after the start, want within [%v, %v]", dl.Sub(now), timeout, timeout+deadlineSlack)
	}
	if again, _ := s.bound(context.Background(), now.Add(deadlineSlack/4)); again != first {
		t.Error("a call a quarter slack later got a context of its own")
	}
	later, _ := s.bound(context.Background(), now.Add(2*deadlineSlack))
	if later == first {
		t.Fatal("a call two slacks later shares a context that ends too soon for it")
	}
	if dl, _ := later.Deadline(); dl.Before(now.Add(2*deadlineSlack + timeout)) {
		t.Errorf("the later call's deadline %v after the start is under its timeout", dl.Sub(now))
	}
	select {
	case <-first.Done():
		if first.Err() != context.DeadlineExceeded {
			t.Errorf("shared context ended with %v", first.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the shared context never ended")
	}
}

// TestClientBudget: a call of one script runs until answerMargin before
// its caller's deadline when that is more than one timeout and at most
// maxClientBudget away; otherwise (several scripts, no deadline, one too
// near or too far) Store.bound decides.
func TestClientBudget(t *testing.T) {
	const timeout = 25 * time.Millisecond
	s := &Store{opt: Options{Timeout: timeout}}
	now := time.Now()
	for _, tc := range []struct {
		name   string
		left   time.Duration // 0: no deadline
		n      int
		client bool
	}{
		{"envoy-60ms", 60 * time.Millisecond, 1, true},
		{"at-the-cap", 4*timeout + answerMargin, 1, true},
		{"beyond-the-cap", 4*timeout + answerMargin + time.Millisecond, 1, false},
		{"within-the-timeout", timeout + answerMargin, 1, false},
		{"two-scripts", 60 * time.Millisecond, 2, false},
		{"no-deadline", 0, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.left > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, now.Add(tc.left))
				defer cancel()
			}
			at, ok := s.clientBudget(ctx, now, tc.n)
			if ok != tc.client {
				t.Fatalf("runs under the client's deadline: got %v, want %v", ok, tc.client)
			}
			if ok && !at.Equal(now.Add(tc.left-answerMargin)) {
				t.Errorf("gives up %v after the start, want %v", at.Sub(now), tc.left-answerMargin)
			}
		})
	}
	// Calls ending within the same millisecond share one context.
	a := s.deadlineAt(now.Add(50 * time.Millisecond))
	if b := s.deadlineAt(now.Add(50*time.Millisecond + deadlineSlack/2)); b != a {
		t.Error("two calls half a slack apart: two contexts")
	}
	if c := s.deadlineAt(now.Add(50*time.Millisecond - time.Microsecond)); c == a {
		t.Error("a call ending earlier shares a context that ends after it")
	}
}
