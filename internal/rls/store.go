package rls

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
type script struct{ text, sha string }

func newScript(text string) *script {
	sum := sha1.Sum([]byte(text))
	return &script{text: text, sha: hex.EncodeToString(sum[:])}
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
	// MaxDebt is how far below zero a settlement may take the bucket
	// (settle.go): the rule's max_debt, 0 for a rule that never settles.
	MaxDebt float64
	// limitArgs, when set, are num(Rate) and num(Burst) (Config.limitArgs).
	limitArgs *[2]string
	// Window, when > 0, makes the op a fixed-window count
	// (fixedwindow.lua): Cost hits added to the counter at Key, which
	// lives Window seconds and is within its limit up to Count. The
	// outcome's Tokens are then the count after the call.
	Window int64
	Count  uint32
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
}

// ErrNotConnected is the error of every Op while the store has not yet
// reached Redis once.
var ErrNotConnected = errors.New("redis: not connected yet")

// StoreOptions configure a Store.
type StoreOptions struct {
	// Addrs are Redis addresses ("host:port"); with Cluster, seed nodes of a
	// Redis Cluster.
	Addrs   []string
	Cluster bool
	// Timeout bounds every call to Redis (a Run, a Ping).
	Timeout time.Duration
	// Observe, when set, is called after every round trip with its
	// duration and error.
	Observe func(d time.Duration, err error)
	// FlushDelay is how long the writer of a connection may wait, while
	// other calls are in flight, to send their commands with one write
	// (rueidis's MaxFlushDelay); 0 sends each at once.
	FlushDelay time.Duration

	// Username and Password authenticate to Redis (AUTH, or an ACL user);
	// TLS, when not nil, makes the connections TLS.
	Username, Password string
	TLS                *tls.Config
	// SentinelMaster, when set, makes Addrs Sentinel addresses and the
	// store follows that master; SentinelUsername, SentinelPassword and
	// SentinelTLS are the Sentinels' own.
	SentinelMaster                     string
	SentinelUsername, SentinelPassword string
	SentinelTLS                        *tls.Config
	// Network is "tcp" (the default) or "unix", when Addrs is one Unix
	// socket path.
	Network string
}

// Store runs the token-bucket script on Redis or a Redis Cluster. It is
// safe for concurrent use. The connection is made in the background, so a
// server can start (and say it is not ready) while Redis is down.
type Store struct {
	opt    StoreOptions
	client atomic.Pointer[rueidis.Client]
	// shared is the deadline context calls starting now share.
	shared   atomic.Pointer[sharedDeadline]
	sharedMu sync.Mutex
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
}

// NewStore returns a Store and starts connecting to Redis; Close stops it.
func NewStore(opt StoreOptions) (*Store, error) {
	if len(opt.Addrs) == 0 {
		return nil, errors.New("no Redis address")
	}
	if len(opt.Addrs) > 1 && !opt.Cluster && opt.SentinelMaster == "" {
		return nil, fmt.Errorf("%d Redis addresses need -redis-cluster (one address is one node)", len(opt.Addrs))
	}
	if opt.Timeout <= 0 {
		return nil, fmt.Errorf("redis timeout must be > 0, got %v", opt.Timeout)
	}
	s := &Store{opt: opt, stop: make(chan struct{}), done: make(chan struct{})}
	go s.connect()
	return s, nil
}

// connect makes the client, retrying every 250 ms until Redis answers once;
// from then on rueidis reconnects by itself.
func (s *Store) connect() {
	defer close(s.done)
	for {
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:       s.opt.Addrs,
			ForceSingleClient: !s.opt.Cluster,
			DisableCache:      true,
			DisableRetry:      true,
			Dialer:            net.Dialer{Timeout: max(s.opt.Timeout, 500*time.Millisecond)},
			// An unresponsive Redis is noticed by the request deadlines; the
			// connection itself is given up after this.
			ConnWriteTimeout: max(20*s.opt.Timeout, 2*time.Second),
			// Pipelining: concurrent calls' commands share a connection
			// and its writes. One connection per node (rueidis's default
			// for a cluster; for one node it would open up to four, one
			// per pair of CPUs): more commands per write system call,
			// which was 15 % of the service's CPU, and Redis, single-
			// threaded, reads them in fewer calls too.
			PipelineMultiplex: -1,
			MaxFlushDelay:     s.opt.FlushDelay,
			Username:          s.opt.Username,
			Password:          s.opt.Password,
			TLSConfig:         s.opt.TLS,
			DialCtxFn:         s.dialFn(),
			Sentinel: rueidis.SentinelOption{MasterSet: s.opt.SentinelMaster, Username: s.opt.SentinelUsername,
				Password: s.opt.SentinelPassword, TLSConfig: s.opt.SentinelTLS},
		})
		if err == nil {
			s.client.Store(&c)
			return
		}
		select {
		case <-s.stop:
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// dialFn is the dialer for Network "unix", else nil (rueidis's own).
func (s *Store) dialFn() func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	if s.opt.Network != "unix" {
		return nil
	}
	return func(ctx context.Context, dst string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
		c, err := d.DialContext(ctx, "unix", dst)
		if err != nil || cfg == nil {
			return c, err
		}
		return tls.Client(c, cfg), nil
	}
}

// Close stops connecting and closes the client.
func (s *Store) Close() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
	if c := s.client.Load(); c != nil {
		(*c).Close()
	}
}

// Ping reports whether Redis answers PING within the timeout (one node of a
// cluster, whichever rueidis picks).
func (s *Store) Ping(ctx context.Context) error {
	c := s.client.Load()
	if c == nil {
		return ErrNotConnected
	}
	ctx, cancel := context.WithTimeout(ctx, s.opt.Timeout)
	defer cancel()
	return (*c).Do(ctx, (*c).B().Ping().Build()).Error()
}

// Run runs the script for every op, all in one pipeline (spread over the
// cluster's masters by key), and returns their outcomes in order. A NOSCRIPT
// answer (a restarted or new node) is retried once with EVAL, which loads
// the script. The whole Run is bounded by the store's timeout.
func (s *Store) Run(ctx context.Context, ops []Op) []Outcome {
	return s.runScripts(ctx, len(ops), func(i int) (*script, string, []string) {
		if ops[i].Lease {
			return leaseScript, ops[i].Key, ops[i].leaseArgs()
		}
		if ops[i].Window > 0 {
			return fixedWindowScript, ops[i].Key, []string{num(ops[i].Cost), strconv.FormatInt(ops[i].Window, 10), strconv.FormatUint(uint64(ops[i].Count), 10)}
		}
		return tokenBucketScript, ops[i].Key, ops[i].args()
	})
}

// runScripts runs n scripts, call(i) naming the i-th with its key and
// arguments, in one pipeline (spread over the cluster's masters by key),
// and returns their outcomes in order. A NOSCRIPT answer is retried once
// with EVAL. The whole is bounded by the store's timeout.
func (s *Store) runScripts(ctx context.Context, n int, call func(i int) (*script, string, []string)) []Outcome {
	out := make([]Outcome, n)
	cp := s.client.Load()
	if cp == nil {
		for i := range out {
			out[i].Err = ErrNotConnected
		}
		return out
	}
	c := *cp
	start := time.Now()
	ctx, cancel := s.bound(ctx, start)
	defer cancel()
	cmds := make(rueidis.Commands, n)
	for i := range cmds {
		sc, key, args := call(i)
		cmds[i] = c.B().Evalsha().Sha1(sc.sha).Numkeys(1).Key(key).Arg(args...).Build()
	}
	var retry []int
	for i, r := range c.DoMulti(ctx, cmds...) {
		if e, ok := rueidis.IsRedisErr(r.Error()); ok && e.IsNoScript() {
			retry = append(retry, i)
			continue
		}
		out[i] = outcome(r)
	}
	if len(retry) > 0 {
		cmds = cmds[:0]
		for _, i := range retry {
			sc, key, args := call(i)
			cmds = append(cmds, c.B().Eval().Script(sc.text).Numkeys(1).Key(key).Arg(args...).Build())
		}
		for j, r := range c.DoMulti(ctx, cmds...) {
			out[retry[j]] = outcome(r)
		}
	}
	if s.opt.Observe != nil {
		var err error
		for _, o := range out {
			if o.Err != nil {
				err = o.Err
				break
			}
		}
		s.opt.Observe(time.Since(start), err)
	}
	return out
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

func (op Op) args() []string {
	rate, burst := op.limitStrings()
	if op.MaxDebt > 0 {
		return []string{rate, burst, num(op.Cost), op.Now, num(op.MaxDebt)}
	}
	if op.Now != "" {
		return []string{rate, burst, num(op.Cost), op.Now}
	}
	return []string{rate, burst, num(op.Cost)}
}

// limitStrings are op's rate and burst as script arguments.
func (op Op) limitStrings() (rate, burst string) {
	if op.limitArgs != nil {
		return op.limitArgs[0], op.limitArgs[1]
	}
	return num(op.Rate), num(op.Burst)
}

// num formats f so that Lua's tonumber reads back the same float64.
func num(f float64) string {
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
	if len(arr) != 2 {
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
	return Outcome{Allowed: allowed == 1, Tokens: tokens}
}

// scriptSHA returns the SHA-1 of the script, which EVALSHA names it by.
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
