package redisstore

import (
	"context"
	"crypto/sha1"
	"crypto/tls"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

//go:embed tokenbucket.lua
var tokenBucketLua string

// The parts tokenbucket.lua and settle.lua share (withParts).
var (
	//go:embed refill.lua
	refillLua string
	//go:embed store.lua
	storeLua string
)

// script is a Lua script as the store runs it: EVALSHA by its digest, and
// EVAL with its text when a node answers NOSCRIPT (a restarted or new node),
// which loads it.
type script struct {
	text, sha string
	// keys is 2 for a script of two keys, whose second key is the first
	// of the arguments its caller names (runEach); else 1.
	keys int
}

func newScript(text string) *script {
	sum := sha1.Sum([]byte(text))
	return &script{text: text, sha: hex.EncodeToString(sum[:]), keys: 1}
}

// withKeys returns sc taking n keys.
func withKeys(sc *script, n int) *script {
	c := *sc
	c.keys = n
	return &c
}

// withParts puts the parts tokenbucket.lua and settle.lua share in place
// of their marker lines: refill.lua (the time, the value's parsing and the
// refill) for "-- @refill", store.lua (the 6-decimal value and its write)
// for "-- @store".
func withParts(text string) string {
	for _, p := range [...]struct{ mark, part string }{{"-- @refill\n", refillLua}, {"-- @store\n", storeLua}} {
		if !strings.Contains(text, p.mark) {
			panic("rls: a script without its " + p.mark)
		}
		text = strings.Replace(text, p.mark, p.part, 1)
	}
	return text
}

var tokenBucketScript = newScript(withParts(tokenBucketLua))

// tokenBucketOverrideScript is tokenBucketScript given the key's override
// hash as KEYS[2] (Op.Override): its rate and burst replace the rule's.
var tokenBucketOverrideScript = withKeys(tokenBucketScript, 2)

//go:embed fixedwindow.lua
var fixedWindowLua string

var fixedWindowScript = newScript(fixedWindowLua)

// Op is one bucket update: take Cost tokens (a refund when negative) from the
// bucket at Key, whose limit is Rate tokens per second up to Burst.
type Op struct {
	Key         string
	Rate, Burst float64
	Cost        float64
	// Now, when not empty, replaces Redis TIME ("<seconds>.<6 digits>"); for
	// tests that compare the script with bucket.Limit at fixed instants.
	Now string
	// Lease makes the op an exact take from a lease-mode bucket (lease.go,
	// lease.lua), whose grants last TTL seconds.
	Lease bool
	TTL   float64
	// LeaseShare is the rule's lease_max, the most a holder's share of
	// the refill may reach (LeaseOp.Share): an exact take only gets the
	// tokens no holder's share keeps. 0: no shares.
	LeaseShare float64
	// MaxDebt is how far below zero the bucket may go (settle.go): the
	// rule's bucket.Limit.MaxDebt, the storage bound 1e12 for a rule that
	// settles (its debt is carried in full), 0 for one without debt.
	MaxDebt float64
	// LimitArgs, when set, are Num(Rate) and Num(Burst), formatted once
	// per rule by the caller (rls.Config).
	LimitArgs *[2]string
	// Window, when > 0, makes the op a fixed-window count
	// (fixedwindow.lua): Cost hits added to the counter at Key, which
	// lives Window seconds and is within its limit up to Count. The
	// outcome's Tokens are then the count after the call.
	Window int64
	Count  uint32
	// Override makes a token bucket's script read the key's override
	// (OverrideKey of the bucket's key, "tb:{...}" for "ov:{...}") in the
	// same call: its rate and burst, when set, replace Rate and Burst.
	Override bool
	// Quota, when not nil, makes the op a calendar quota's decision
	// (quota.go, quota.lua) on the consumption at Key.
	Quota *QuotaOp
	// Receipt, when set, is the key of the stream's receipt (ReceiptKey
	// of Key): the take adds what it took there, a refund takes it off
	// (receipt.go). Token buckets and quotas only.
	Receipt string
}

// Outcome is what the script decided for one Op.
type Outcome struct {
	Allowed bool
	// Tokens are the tokens in the bucket after the decision, floored to 6
	// decimals as stored.
	Tokens float64
	// Err is a Redis failure (connection, timeout, error reply): nothing is
	// known about the bucket.
	Err error
	// Quota is a quota op's answer (Tokens are then the units left under
	// its limit); nil for other ops.
	Quota *QuotaResult
	// Cut reports that a settlement's receipt did not cover it: it gave
	// back less than asked, or did not reset (settle.lua).
	Cut bool
}

// observe reports one round trip (or a failure to make one) to
// Options.Observe, the metrics' and the error log's source.
func (s *Store) observe(d time.Duration, err error) {
	if s.opt.Observe != nil {
		s.opt.Observe(d, err)
	}
}

// ErrNotConnected is the error of every Op while the store has not yet
// reached Redis once.
var ErrNotConnected = errors.New("redis: not connected yet")

// Options configure a Store.
type Options struct {
	// Addrs are Redis addresses ("host:port"); with Cluster, seed nodes of a
	// Redis Cluster; with SentinelMaster, Sentinel addresses.
	Addrs   []string
	Cluster bool
	// Timeout bounds every call to Redis (a Run, a Ping) whose caller's
	// context has no earlier deadline.
	Timeout time.Duration
	// Observe, when set, is called after every round trip with its
	// duration and error.
	Observe func(d time.Duration, err error)
	// FlushDelay is how long the writer of a connection may wait, while
	// other calls are in flight, to send their commands with one write
	// (rueidis's MaxFlushDelay); 0 sends each at once.
	FlushDelay time.Duration

	// Username and Password authenticate every connection to Redis (AUTH
	// in HELLO): an ACL user, or Password alone for requirepass (the
	// "default" user).
	Username, Password string
	// TLS, when not nil, is the TLS configuration of every connection to
	// Redis (its RootCAs, client Certificates and ServerName); nil is
	// plain TCP.
	TLS *tls.Config
	// SentinelMaster, when set, is the name of the master set Redis
	// Sentinel monitors: Addrs are then Sentinel addresses, and the store
	// follows that set's master through failovers.
	SentinelMaster string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// (which have users of their own); SentinelTLS is their TLS
	// configuration (nil: plain TCP).
	SentinelUsername, SentinelPassword string
	SentinelTLS                        *tls.Config
	// Network is "tcp" (the default) or "unix", when Addrs is one Unix
	// socket path.
	Network string
}

// Store runs the token-bucket script on Redis, a Redis Cluster or the
// master a Redis Sentinel names. It is safe for concurrent use. The
// connection is made in the background, so a server can start (and say it
// is not ready) while Redis is down.
type Store struct {
	opt    Options
	client atomic.Pointer[rueidis.Client]
	// shared is the deadline context calls starting now share.
	shared   atomic.Pointer[sharedDeadline]
	sharedAt atomic.Pointer[sharedDeadline] // Store.deadlineAt's
	sharedMu sync.Mutex
	// lanes keep calls away from Redis nodes that do not answer
	// (guard.go).
	lanes lanes
	// perms is the permission check's state (acl.go).
	perms perms
	// connectErr is the last failure to make the client (connect).
	connectErr atomic.Pointer[error]
	stop       chan struct{}
	done       chan struct{}
	once       sync.Once
}

// NewStore returns a Store and starts connecting to Redis; Close stops it.
func New(opt Options) (*Store, error) {
	if len(opt.Addrs) == 0 {
		return nil, errors.New("no Redis address")
	}
	if opt.SentinelMaster != "" && opt.Cluster {
		return nil, errors.New("a Sentinel master set and a Redis Cluster exclude each other")
	}
	if len(opt.Addrs) > 1 && !opt.Cluster && opt.SentinelMaster == "" {
		return nil, fmt.Errorf("%d Redis addresses need -redis-cluster or -redis-sentinel-master (one address is one node)", len(opt.Addrs))
	}
	if opt.Timeout <= 0 {
		return nil, fmt.Errorf("redis timeout must be > 0, got %v", opt.Timeout)
	}
	s := &Store{opt: opt, stop: make(chan struct{}), done: make(chan struct{})}
	s.lanes.init()
	s.lanes.one.s = s
	go s.connect()
	return s, nil
}

// Run runs the script for every op, all in one pipeline (spread over the
// cluster's masters by key), and returns their outcomes in order. A NOSCRIPT
// answer (a restarted or new node) is retried once with EVAL, which loads
// the script. The whole Run is bounded by the store's timeout.
func (s *Store) Run(ctx context.Context, ops []Op) []Outcome {
	out := make([]Outcome, len(ops))
	s.runEach(ctx, len(ops), func(i int) (*script, string, []string) {
		switch op := &ops[i]; {
		case op.Quota != nil:
			return quotaScript, withReceipt(op.Key, op.Receipt), op.quotaArgs()
		case op.Lease:
			return leaseScript, op.Key, op.leaseArgs()
		case op.Window > 0:
			return fixedWindowScript, op.Key, []string{Num(op.Cost), strconv.FormatInt(op.Window, 10), strconv.FormatUint(uint64(op.Count), 10)}
		case op.Override:
			if ov := OverrideOf(op.Key); ov != "" {
				return tokenBucketOverrideScript, withReceipt(op.Key, op.Receipt), append([]string{ov}, op.args()...)
			}
		}
		return tokenBucketScript, withReceipt(ops[i].Key, ops[i].Receipt), ops[i].args()
	}, func(i int, r rueidis.RedisResult, err error) error {
		switch {
		case err != nil:
			out[i] = Outcome{Err: err}
		case ops[i].Quota != nil:
			out[i] = quotaOutcome(r)
		default:
			out[i] = outcome(r)
		}
		return out[i].Err
	})
	return out
}

// runEach runs n scripts, call(i) naming the i-th with its key and
// arguments, in one pipeline (spread over the cluster's masters by key),
// and hands each answer to set: the reply, or the error that kept the
// command from being sent; set returns the error the answer means. A
// NOSCRIPT answer is retried with EVAL; a failure that certainly ran
// nothing (Store.retryable) is retried once while the deadline leaves
// time. The whole is bounded by the caller's deadline or the store's
// timeout, whichever is first, and no call is sent to a Redis node that
// does not answer (guard.go): it fails at once with ErrBacklog instead.
func (s *Store) runEach(ctx context.Context, n int, call func(i int) (*script, string, []string), set func(i int, r rueidis.RedisResult, err error) error) {
	var errBuf [2]error
	errs := errBuf[:0]
	for range n {
		errs = append(errs, nil)
	}
	cp := s.client.Load()
	if cp == nil {
		for i := range n {
			errs[i] = set(i, rueidis.RedisResult{}, ErrNotConnected)
		}
		s.observe(0, ErrNotConnected)
		return
	}
	c := *cp
	start := time.Now()
	if at, ok := s.clientBudget(ctx, start, n); ok {
		ctx = s.deadlineAt(at)
	} else {
		var cancel context.CancelFunc
		ctx, cancel = s.bound(ctx, start)
		defer cancel()
	}
	// eval marks the scripts a node did not know (NOSCRIPT): EVAL loads
	// them. rueidis recycles a command once sent, so a retry builds it
	// again.
	var evalBuf [2]bool
	eval := evalBuf[:0]
	for range n {
		eval = append(eval, false)
	}
	build := func(i int) rueidis.Completed {
		sc, key, args := call(i)
		if first, receipt, withReceipt := strings.Cut(key, keySep); withReceipt || sc.keys == 2 {
			// More keys than one: a script of two keys (quota.go) takes its
			// second from args[0]; a receipt (receipt.go) comes last.
			var kb [3]string
			keys := append(kb[:0], first)
			if sc.keys == 2 {
				keys, args = append(keys, args[0]), args[1:]
			}
			if withReceipt {
				keys = append(keys, receipt)
			}
			if eval[i] {
				return c.B().Eval().Script(sc.text).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
			}
			return c.B().Evalsha().Sha1(sc.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
		}
		if eval[i] {
			return c.B().Eval().Script(sc.text).Numkeys(1).Key(key).Arg(args...).Build()
		}
		return c.B().Evalsha().Sha1(sc.sha).Numkeys(1).Key(key).Arg(args...).Build()
	}
	cmds := make(rueidis.Commands, n)
	var idxBuf [2]int
	idx := idxBuf[:0]
	for i := range n {
		idx = append(idx, i)
	}
	record := func(i int, r rueidis.RedisResult, err error) { errs[i] = set(i, r, err) }
	for attempt := 0; attempt < 3 && len(idx) > 0; attempt++ {
		for _, i := range idx {
			cmds[i] = build(i)
		}
		s.do(ctx, cmds, idx, record)
		var retry []int
		for _, i := range idx {
			if e, ok := rueidis.IsRedisErr(errs[i]); ok && e.IsNoScript() && !eval[i] {
				eval[i] = true
				retry = append(retry, i)
			} else if attempt == 0 && s.retryable(ctx, errs[i]) {
				retry = append(retry, i)
			}
		}
		idx = retry
	}
	var err error
	for _, e := range errs {
		if e != nil {
			err = e
			break
		}
	}
	if err != nil || s.perms.unchecked.Load() {
		s.noteAnswers(n, call, errs)
	}
	s.observe(time.Since(start), err)
}

// do sends cmds[i] for every i of idx in one pipeline, except those for
// a node that does not answer (guard.go), and hands each answer (or
// ErrBacklog) to record.
func (s *Store) do(ctx context.Context, cmds rueidis.Commands, idx []int, record func(i int, r rueidis.RedisResult, err error)) {
	type sent struct {
		i    int
		l    *lane
		mark uint64
	}
	var buf [2]sent
	ss := buf[:0]
	for _, i := range idx {
		l := s.lanes.of(cmds[i].Slot())
		if !l.admit() {
			record(i, rueidis.RedisResult{}, ErrBacklog)
			continue
		}
		ss = append(ss, sent{i: i, l: l, mark: l.enter()})
	}
	if len(ss) == 0 {
		return
	}
	send := cmds // the usual case: every command, in order
	if len(ss) != len(cmds) {
		send = make(rueidis.Commands, len(ss))
		for j, x := range ss {
			send[j] = cmds[x.i]
		}
	}
	for j, r := range (*s.client.Load()).DoMulti(ctx, send...) {
		record(ss[j].i, r, nil)
		ss[j].l.leave(ss[j].mark, r.NonRedisError())
	}
}

// doOne sends one command as do sends many: not to a node that does not
// answer (ErrBacklog, and no result), and counted on its node's lane.
func (s *Store) doOne(ctx context.Context, c rueidis.Client, cmd rueidis.Completed) (rueidis.RedisResult, error) {
	l := s.lanes.of(cmd.Slot())
	if !l.admit() {
		return rueidis.RedisResult{}, ErrBacklog
	}
	mark := l.enter()
	r := c.Do(ctx, cmd)
	l.leave(mark, r.NonRedisError())
	return r, nil
}

// retryable reports whether err is a failure after which the script
// certainly did not run, and ctx leaves time to try again: a connection
// that could not be made, or Redis answering that it cannot run commands
// now (a cluster between masters, a node loading its data, a master that
// became a replica). A timeout is never retried: the script may have run,
// and the time is gone anyway.
func (s *Store) retryable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < time.Millisecond {
		return false
	}
	if e, ok := rueidis.IsRedisErr(err); ok {
		return e.IsClusterDown() || e.IsTryAgain() || e.IsLoading() ||
			strings.HasPrefix(e.Error(), "READONLY") || strings.HasPrefix(e.Error(), "MASTERDOWN")
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func (op Op) args() []string {
	rate, burst := op.limitStrings()
	if op.MaxDebt > 0 {
		return []string{rate, burst, Num(op.Cost), op.Now, Num(op.MaxDebt)}
	}
	if op.Now != "" {
		return []string{rate, burst, Num(op.Cost), op.Now}
	}
	return []string{rate, burst, Num(op.Cost)}
}

// limitStrings are op's rate and burst as script arguments.
func (op Op) limitStrings() (rate, burst string) {
	if op.LimitArgs != nil {
		return op.LimitArgs[0], op.LimitArgs[1]
	}
	return Num(op.Rate), Num(op.Burst)
}

// Num formats f so that Lua's tonumber reads back the same float64.
func Num(f float64) string {
	if f == 1 { // the usual cost
		return "1"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

func outcome(r rueidis.RedisResult) Outcome {
	arr, err := r.ToArray()
	if err != nil {
		return Outcome{Err: err}
	}
	if len(arr) != 2 && len(arr) != 3 {
		return Outcome{Err: fmt.Errorf("redis: script returned %d values, want 2", len(arr))}
	}
	allowed, err := arr[0].AsInt64()
	if err != nil {
		return Outcome{Err: fmt.Errorf("redis: script: %w", err)}
	}
	ts, err := arr[1].ToString()
	if err != nil {
		return Outcome{Err: fmt.Errorf("redis: script: %w", err)}
	}
	tokens, err := strconv.ParseFloat(ts, 64)
	if err != nil {
		return Outcome{Err: fmt.Errorf("redis: script returned tokens %q", ts)}
	}
	o := Outcome{Allowed: allowed == 1, Tokens: tokens}
	if len(arr) == 3 { // settle.lua's: whether the receipt cut the settlement
		cut, _ := arr[2].AsInt64()
		o.Cut = cut == 1
	}
	return o
}

// BucketKey returns the Redis key of rule's bucket for the composite key
// (sharedstate's composite: the percent-encoded limit-key values joined by
// '|'): "tb:{<rule>:<composite>}". The braces are the Redis Cluster hash
// tag: the whole bucket identity is hashed, so the buckets of one rule
// spread over every master, and a composite key never holds '{' or '}'
// (they are percent-encoded), so the tag always ends where the key does.
func BucketKey(rule, composite string) string {
	var b strings.Builder
	b.Grow(len(rule) + len(composite) + 6)
	b.WriteString("tb:{")
	b.WriteString(rule)
	b.WriteByte(':')
	b.WriteString(composite)
	b.WriteByte('}')
	return b.String()
}
