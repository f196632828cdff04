package filter

// continuation is everything a paused request needs to go on later, in one
// value of its request state (reqState.cont): the rate-limit call it waits for (a
// cluster rule's or a cold lease rule's), the hold prepared for it while
// that call or a lease refill decides (delayed admission after the other
// rules), and its hold in the timer once every rule admitted it. Lease
// waits keep their own record (leaseWaiter) that points back at the
// stream; it reaches the request's hold through cont.pending.
//
// Who builds it: the stages of OnRequestHeaders, through await (the hold
// handed over to a call or a lease wait), askCluster (call) and startHold
// (held). Who ends it: proceed and waiter.due (the request goes on),
// dropHold (it is rejected), and Stream.end (the stream ended first).
type continuation struct {
	// call is the token of the rate-limit call the request waits for, 0
	// for none.
	call uint32
	// pending is the request's prepared hold while the rate-limit service
	// or a lease decides its other rules, before it starts; nil for none.
	pending *waiter
	// held is the request's place in the plugin's timer heap while it is
	// held for its reservation (delay.go).
	held *waiter
}

// await hands the prepared hold w (nil: none) to whatever decides the
// request next: a call's answer or a lease refill starts or drops it.
func (c *continuation) await(w *waiter) { c.pending = w }

// end is the one place a stream ends, however the host reports it
// (proxy_on_done, or proxy_on_delete from a host that skipped on_done):
// nothing it waited for resumes it any more (abandon), a held request is
// never released (cancelWait), and what it charged is settled and its
// places in flight released (finish). Each step runs once.
func (s *Stream) end() {
	s.abandon()
	s.cancelWait()
	s.finish()
}
