package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// ErrBacklog is the error of a call that was not sent because its Redis
// node does not answer: a call to it timed out and nothing sent to it
// since has been answered for a while (tripAfter), or its connection
// holds laneLimit calls awaiting answers.
var ErrBacklog = errors.New("redis: node not answering (calls to it time out); not sent")

// laneLimit is how many calls the store lets one node's connection hold
// (in flight, or given up by their callers but still queued): half of
// rueidis's queue, whose other half is room for rueidis's own PINGs and
// the calls that pass the check at the same instant.
//
// Why: rueidis queues each command of a connection in a ring of
// 2^ringScale slots, and a call that finds the ring full waits for a free
// slot whatever its context says (redis/rueidis#858). A call that times
// out leaves its command queued until Redis answers it or the connection
// is given up (pingGap + connTimeout later), so with a frozen Redis and a
// few thousand calls a second the ring filled, and calls waited seconds
// past their deadline (issue 23, defect 1).
const laneLimit = 1 << (ringScale - 1)

// lane is what the store knows of one Redis node's connection, to keep
// calls away from a node that does not answer: rueidis does not bound by
// the call's deadline either a wait for a queue slot (above) or a wait for
// a new connection's handshake, which other calls' waits join and which,
// when it fails, can take a second more (rueidis closes the half-made
// connection with a one-second wait). So calls are not sent to a node
// whose answers stopped: only the lane's watchdog is, and its PING is the
// one that waits for a new connection.
//
// Answers come back in the order the commands were sent, so an answer (or
// an error that ended the connection) to a call sent after a timed-out
// one means the timed-out one's command is no longer queued: mark and
// leave keep that account without knowing which command is which.
type lane struct {
	s        *Store
	inflight atomic.Int64
	// timeouts counts calls that gave up waiting; cleared is the number
	// of them known to be answered or dropped with their connection.
	timeouts, cleared atomic.Uint64
	// since is when (Unix nanoseconds) a call timed out with no answer
	// from the node since (0: answers came after every timeout);
	// silentMark is the timeouts count then: an answer to a call sent
	// after it ends the silence. A connection's end is no answer: the
	// next connection's handshake is what must not be waited for.
	since      atomic.Int64
	silentMark atomic.Uint64
	once       sync.Once
}

// held is what the lane's connection may hold: calls in flight and calls
// given up whose commands may still be queued.
func (l *lane) held() int64 {
	return l.inflight.Load() + int64(l.timeouts.Load()-l.cleared.Load())
}

// admit reports whether a call may be sent on the lane: unless a timeout
// has gone unanswered for tripAfter, and while the connection holds less
// than laneLimit calls.
func (l *lane) admit() bool {
	if since := l.since.Load(); since != 0 && time.Now().UnixNano()-since >= int64(l.s.tripAfter()) {
		return false
	}
	return l.held() < laneLimit
}

// enter counts a call about to be sent and returns its mark: the calls
// that had timed out before it.
func (l *lane) enter() uint64 {
	l.inflight.Add(1)
	return l.timeouts.Load()
}

// leave counts the end of a call entered with mark: err is its error
// other than a Redis error reply (nil for any answer).
func (l *lane) leave(mark uint64, err error) {
	l.inflight.Add(-1)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		n := l.timeouts.Add(1)
		// A caller that gave up early says nothing of the node; one
		// whose deadline passed does.
		if errors.Is(err, context.DeadlineExceeded) && l.since.CompareAndSwap(0, time.Now().UnixNano()) {
			l.silentMark.Store(n)
		}
		return
	}
	// An answer, or the end of the connection: every command sent
	// before this one has been answered or dropped.
	for {
		c := l.cleared.Load()
		if c >= mark || l.cleared.CompareAndSwap(c, mark) {
			break
		}
	}
	if err == nil && mark >= l.silentMark.Load() {
		l.since.Store(0)
	}
}

// watch starts, once, the lane's watchdog: a PING to the node (ping)
// every watchEvery, counted like a call, and bounded by the connection's
// timeout, so that a Redis slower than -redis-timeout but answering ends
// the silence when its answer comes.
// It finds an unresponsive node when no call does (little traffic), and
// it is what clears the lane once the node answers again. It ends when
// the store is closed.
func (l *lane) watch(ping func(ctx context.Context) error) {
	l.once.Do(func() {
		go func() {
			t := time.NewTicker(l.s.watchEvery())
			defer t.Stop()
			for {
				mark := l.enter()
				ctx, cancel := context.WithTimeout(context.Background(), l.s.connTimeout())
				err := ping(ctx)
				cancel()
				if _, ok := rueidis.IsRedisErr(err); ok {
					err = nil // an answer
				}
				l.leave(mark, err)
				select {
				case <-l.s.stop:
					return
				case <-t.C:
				}
			}
		}()
	})
}

// tripAfter is how long a timeout may go unanswered before calls stop
// being sent to the node; watchEvery how often the watchdog PINGs it.
// Both are well inside pingGap + connTimeout, the earliest rueidis gives
// a silent connection up and the next call would wait for a new one.
func (s *Store) tripAfter() time.Duration  { return s.opt.Timeout }
func (s *Store) watchEvery() time.Duration { return max(s.opt.Timeout, 20*time.Millisecond) }

// lanes maps a key's hash slot to its node's lane: one lane for a single
// node (and for slots of no known master), one per master of a cluster
// from its slot map (topology.go).
type lanes struct {
	one   lane
	slots atomic.Pointer[[]*lane] // 16384 entries, nil before the first map
	// byAddr keeps each master's lane across slot maps; only the
	// topology refresh touches it.
	byAddr map[string]*lane
}

func (ls *lanes) init() { ls.byAddr = map[string]*lane{} }

// of returns the lane of a command's slot (rueidis's Completed.Slot: a
// hash slot, or a value above 16383 for a command without a key).
func (ls *lanes) of(slot uint16) *lane {
	if t := ls.slots.Load(); t != nil && int(slot) < len(*t) {
		if l := (*t)[slot]; l != nil {
			return l
		}
	}
	return &ls.one
}
