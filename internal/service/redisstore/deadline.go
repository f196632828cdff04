package redisstore

import (
	"context"
	"time"
)

// clientBudget returns when a call of n scripts starting at now gives up
// and true, if it runs under its caller's deadline rather than the store's
// timeout: a call of one script whose caller set a deadline (a gRPC
// client's grpc-timeout) more than one timeout and at most
// maxClientBudget away. It gives up answerMargin before the caller does,
// so that the caller hears UNAVAILABLE rather than its own deadline.
//
// Why: a request of one descriptor makes one round trip, never a refund
// (there is nothing else to give back), so it may use all the time its
// client gives it; on a busy host a round trip can take longer than
// -redis-timeout without anything being wrong, and failing it sent the
// client to its failure rule for nothing (issue 23, defect 2). A request
// of several descriptors may need a refund after the take, so each of its
// round trips keeps the store's timeout (Store.bound).
func (s *Store) clientBudget(ctx context.Context, now time.Time, n int) (time.Time, bool) {
	if n != 1 {
		return time.Time{}, false
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return time.Time{}, false
	}
	at := dl.Add(-answerMargin)
	left := at.Sub(now)
	return at, left > s.opt.Timeout && left <= s.maxClientBudget()
}

// answerMargin is how long before its caller's deadline a call under it
// gives up (clientBudget).
const answerMargin = 2 * time.Millisecond

// maxClientBudget is the longest a call runs under its caller's deadline:
// 4 × the store's timeout (100 ms with the default). A caller that allows
// longer (a client with a deadline of seconds) gets the store's timeout.
func (s *Store) maxClientBudget() time.Duration { return 4 * s.opt.Timeout }

// deadlineAt returns a context ending between deadlineSlack before at and
// at, shared by the calls whose ends fall in that interval (see
// Store.deadline for why shared): Envoy's calls carry the same timeout, so
// the calls of one millisecond share one.
func (s *Store) deadlineAt(at time.Time) context.Context {
	ok := func(d *sharedDeadline) bool {
		return d != nil && !d.at.After(at) && at.Sub(d.at) <= deadlineSlack
	}
	if d := s.sharedAt.Load(); ok(d) {
		return d.ctx
	}
	s.sharedMu.Lock()
	defer s.sharedMu.Unlock()
	if d := s.sharedAt.Load(); ok(d) {
		return d.ctx
	}
	d := &sharedDeadline{at: at}
	d.ctx, d.cancel = context.WithDeadline(context.Background(), at)
	s.sharedAt.Store(d)
	return d.ctx
}

// bound returns the context a Redis round trip starting now runs under:
// ctx itself when it ends within the store's timeout anyway (Envoy's
// default timeout for the service, 20 ms, is shorter than ours) or has
// ended already (the call then fails at once, taking nothing); otherwise a
// context that ends one timeout from now, to within deadlineSlack, shared
// by the calls of that interval (Store.deadline). A call whose caller
// gives up meanwhile waits for its answer from Redis, which the
// cancellation could not have withdrawn anyway.
func (s *Store) bound(ctx context.Context, now time.Time) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && dl.Sub(now) <= s.opt.Timeout || ctx.Err() != nil {
		return ctx, func() {}
	}
	return s.deadline(now), func() {}
}

// deadlineSlack is how much later than one timeout from its start a call
// may be given up: the lifetime of a shared deadline context.
const deadlineSlack = time.Millisecond

// sharedDeadline is a context that ends at at.
type sharedDeadline struct {
	ctx    context.Context
	cancel context.CancelFunc // never called: the context's own timer ends it
	at     time.Time
}

// deadline returns a context ending between one timeout and one timeout
// plus deadlineSlack after now. A context per call, and its timer, cost
// about 4 % of the service's CPU under load (its deadline, its timer, its
// registration with the call's context); calls starting within the same
// millisecond share one instead.
func (s *Store) deadline(now time.Time) context.Context {
	ok := func(d *sharedDeadline) bool {
		if d == nil {
			return false
		}
		left := d.at.Sub(now)
		return left >= s.opt.Timeout && left <= s.opt.Timeout+deadlineSlack
	}
	if d := s.shared.Load(); ok(d) {
		return d.ctx
	}
	s.sharedMu.Lock()
	defer s.sharedMu.Unlock()
	if d := s.shared.Load(); ok(d) {
		return d.ctx
	}
	d := &sharedDeadline{at: now.Add(s.opt.Timeout + deadlineSlack)}
	d.ctx, d.cancel = context.WithDeadline(context.Background(), d.at)
	s.shared.Store(d)
	return d.ctx
}
