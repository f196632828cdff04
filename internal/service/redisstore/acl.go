package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Permissions (docs/rls.md, "Redis"): a Redis ACL user that lacks a
// command or a key pattern a script needs fails every call of that kind
// with NOPERM while PING still answers. Store.Ping therefore also checks,
// with Redis 7's redis.acl_check_cmd, that the user may run every script
// and every command the scripts run on a key of each kind the service
// always uses (token buckets "tb:", RLQS shares "tq:"), and on the key of
// any call that failed for lack of permission since (a lease "tl:", a
// drop-in fixed window, a quota "qt:" or a bucket with its override
// "ov:"). The check runs on every master, answers nothing
// about the data and writes nothing.

// ErrPermission is wrapped by Ping's error when Redis's user lacks a
// permission the service needs.
var ErrPermission = errors.New("redis: the user lacks permissions the service needs")

// aclCheckScript answers which of the commands in ARGV (each given as its
// argument count, then its arguments) the user may not run: their 1-based
// indexes, or {-1} where Redis has no redis.acl_check_cmd (before 7.0).
var aclCheckScript = newScript(`if redis.acl_check_cmd == nil then return {-1} end
local out, i, n = {}, 1, 0
while i <= #ARGV do
  local c = tonumber(ARGV[i])
  n = n + 1
  if not redis.acl_check_cmd(unpack(ARGV, i + 1, i + c)) then out[#out + 1] = n end
  i = i + c + 1
end
return out
`)

// permCheckEvery is how often Ping checks permissions while the last
// check passed and no call failed for lack of them.
const permCheckEvery = 10 * time.Second

// scriptNeeds are the commands a script runs on its key k (the Lua files'
// redis.call lines), for the permission check.
func scriptNeeds(sc *script, k string) [][]string {
	switch sc {
	case tokenBucketScript:
		return [][]string{{"TIME"}, {"GET", k}, {"SET", k, "0", "PX", "1"}}
	case settleScript:
		return [][]string{{"TIME"}, {"GET", k}, {"SET", k, "0", "PX", "1"}, {"DEL", k}}
	case leaseScript:
		return [][]string{{"TIME"}, {"HGETALL", k}, {"HSET", k, "f", "v"}, {"HDEL", k, "f"}, {"PEXPIRE", k, "1"}}
	case shareScript:
		// HMGET: share.lua reads only the fields a call needs (running
		// totals); HGETALL once, to rebuild a bucket written without them.
		return [][]string{{"TIME"}, {"HMGET", k, "f"}, {"HGETALL", k}, {"HSET", k, "f", "v"}, {"HDEL", k, "f"}, {"PEXPIRE", k, "1"}}
	case fixedWindowScript:
		return [][]string{{"INCRBY", k, "1"}, {"EXPIRE", k, "1"}}
	case tokenBucketOverrideScript:
		return [][]string{{"HMGET", secondKey(sc, k), "rate", "burst"}, {"TIME"}, {"GET", k}, {"SET", k, "0", "PX", "1"}}
	case quotaScript:
		// GET, SET and DEL of k stand for the receipt's
		// ("<k>:r:<id>", under the same prefix).
		return [][]string{{"HGET", secondKey(sc, k), "limit"}, {"HMGET", k, "u", "t"}, {"HSET", k, "u", "0"}, {"EXPIRE", k, "1"}, {"DEL", k},
			{"GET", k}, {"SET", k, "0", "NX", "PX", "1"}}
	}
	return nil
}

// secondKey is the second key a script of two keys runs with, when its
// first is k: the override hash of k's hash tag ("ov:{...}").
func secondKey(sc *script, k string) string {
	if sc.keys != 2 {
		return ""
	}
	i, j := strings.IndexByte(k, '{'), strings.LastIndexByte(k, '}')
	if i < 0 || j < i {
		return ""
	}
	return "ov:" + k[i:j+1]
}

// evalKeys are the EVALSHA arguments after the digest that run sc on k:
// the key count and the keys.
func evalKeys(sc *script, k string) []string {
	if sc.keys == 2 {
		return []string{"2", k, secondKey(sc, k)}
	}
	return []string{"1", k}
}

// scriptName names a script in the check's messages.
func scriptName(sc *script) string {
	switch sc {
	case tokenBucketScript:
		return "token bucket"
	case settleScript:
		return "settlement"
	case leaseScript:
		return "lease"
	case shareScript:
		return "RLQS share"
	case fixedWindowScript:
		return "fixed window"
	case tokenBucketOverrideScript:
		return "token bucket with its override"
	case quotaScript:
		return "quota"
	}
	return "script"
}

// permUse is one script run on one key: what the check asks about.
type permUse struct {
	sc  *script
	key string
}

// perms is the store's permission state.
type perms struct {
	mu sync.Mutex
	// denied are the uses that failed with NOPERM since the last check
	// that passed (at most maxDenied).
	denied map[permUse]bool
	// ok is whether the last check passed; at when it ran.
	ok bool
	at time.Time
	// unchecked: Redis cannot check (no redis.acl_check_cmd); a denial
	// then holds until a call of its script succeeds.
	unchecked atomic.Bool
}

const maxDenied = 16

// isNoPerm reports whether err is Redis refusing the user a command or a
// key: NOPERM for the script's own command or key, the script error
// Redis 7 gives for a command the script runs.
func isNoPerm(err error) bool {
	e, ok := rueidis.IsRedisErr(err)
	if !ok {
		return false
	}
	msg := e.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "can't run this command")
}

// notePerm records the answer to sc run on key: a refusal for lack of
// permission makes Ping check (and fail) until a check passes.
func (s *Store) notePerm(sc *script, key string, err error) {
	if err == nil || !isNoPerm(err) {
		return
	}
	s.perms.mu.Lock()
	defer s.perms.mu.Unlock()
	if s.perms.denied == nil {
		s.perms.denied = make(map[permUse]bool)
	}
	if len(s.perms.denied) < maxDenied {
		s.perms.denied[permUse{sc, key}] = true
	}
	s.perms.ok = false
}

// noteAnswers passes runEach's answers to notePerm, and where Redis
// cannot check permissions, clears the denials of the scripts that ran.
func (s *Store) noteAnswers(n int, call func(i int) (*script, string, []string), errs []error) {
	unchecked := s.perms.unchecked.Load()
	for i := range n {
		if errs[i] != nil && isNoPerm(errs[i]) {
			sc, key, _ := call(i)
			key, _, _ = strings.Cut(key, keySep) // the bucket's, not its receipt's
			s.notePerm(sc, key, errs[i])
		} else if errs[i] == nil && unchecked {
			sc, _, _ := call(i)
			s.noteSuccess(sc)
		}
	}
}

// noteSuccess clears, where Redis cannot check permissions, the
// denials of sc: a call of it succeeded.
func (s *Store) noteSuccess(sc *script) {
	s.perms.mu.Lock()
	defer s.perms.mu.Unlock()
	for u := range s.perms.denied {
		if u.sc == sc {
			delete(s.perms.denied, u)
		}
	}
}

// checkPerms is Ping's permission check of every node in nodes (the
// masters; the one node), run when due: its error wraps ErrPermission and
// names what is missing.
func (s *Store) checkPerms(ctx context.Context, nodes map[string]rueidis.Client) error {
	now := time.Now()
	s.perms.mu.Lock()
	due := !s.perms.ok || len(s.perms.denied) > 0 || now.Sub(s.perms.at) >= permCheckEvery
	uses := []permUse{
		{tokenBucketScript, BucketKey("tokengate-acl-check", "k")},
		{settleScript, BucketKey("tokengate-acl-check", "k")},
		{shareScript, ShareKey("tokengate-acl-check", "k")},
	}
	for u := range s.perms.denied {
		uses = append(uses, u)
	}
	s.perms.mu.Unlock()
	if !due {
		return nil
	}
	if s.perms.unchecked.Load() {
		return s.uncheckedDenials()
	}
	// names[i] is the i-th command's group (what it is for) and name.
	type named struct{ group, cmd string }
	names := []named{{"", "PING"}}
	argv := []string{"1", "PING"}
	if s.opt.Cluster {
		argv = append(argv, "2", "CLUSTER", "SLOTS", "2", "CLUSTER", "SHARDS")
		names = append(names, named{"the slot map", "CLUSTER SLOTS"}, named{"the slot map", "CLUSTER SHARDS"})
	}
	for _, u := range uses {
		group := "on key " + strconv.Quote(u.key) + " (" + scriptName(u.sc) + ")"
		ks := evalKeys(u.sc, u.key)
		cmds := append([][]string{append([]string{"EVALSHA", u.sc.sha}, ks...), append([]string{"EVAL", "return 1"}, ks...)}, scriptNeeds(u.sc, u.key)...)
		for _, c := range cmds {
			argv = append(argv, strconv.Itoa(len(c)))
			argv = append(argv, c...)
			names = append(names, named{group, c[0]})
		}
	}
	var missing []named
	var errs []error
	addrs := make([]string, 0, len(nodes))
	for a := range nodes {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs) // one message for one state: the log notes changes
	for _, addr := range addrs {
		r, err := s.runCheck(ctx, nodes[addr], argv)
		if err != nil {
			if isNoPerm(err) {
				missing = append(missing, named{"for every script", "EVALSHA or EVAL"})
				continue
			}
			errs = append(errs, fmt.Errorf("redis: %s: permission check: %w", addr, err))
			continue
		}
		if len(r) == 1 && r[0] == -1 {
			s.perms.unchecked.Store(true)
			return s.uncheckedDenials()
		}
		for _, i := range r {
			if i >= 1 && int(i) <= len(names) {
				missing = append(missing, names[i-1])
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	s.perms.mu.Lock()
	defer s.perms.mu.Unlock()
	s.perms.at = now
	s.perms.ok = len(missing) == 0
	if s.perms.ok {
		for _, u := range uses {
			delete(s.perms.denied, u)
		}
		return nil
	}
	// "EVALSHA, EVAL, HGETALL on key "tq:{…}" (RLQS share); PING"
	var groups []string
	cmds := map[string][]string{}
	for _, m := range missing {
		if _, ok := cmds[m.group]; !ok {
			groups = append(groups, m.group)
		}
		if !slices.Contains(cmds[m.group], m.cmd) {
			cmds[m.group] = append(cmds[m.group], m.cmd)
		}
	}
	sort.Strings(groups)
	parts := make([]string, len(groups))
	for i, g := range groups {
		parts[i] = strings.TrimSpace(strings.Join(cmds[g], ", ") + " " + g)
	}
	return fmt.Errorf("%w: not allowed to run %s", ErrPermission, strings.Join(parts, "; "))
}

// uncheckedDenials is checkPerms where Redis cannot check: an error while
// a call failed for lack of permission and no call of its script has
// succeeded since.
func (s *Store) uncheckedDenials() error {
	s.perms.mu.Lock()
	defer s.perms.mu.Unlock()
	var missing []string
	for u := range s.perms.denied {
		missing = append(missing, scriptName(u.sc)+" on key "+strconv.Quote(u.key))
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	return fmt.Errorf("%w: refused %s", ErrPermission, strings.Join(missing, ", "))
}

// runCheck runs aclCheckScript with argv on one node (EVALSHA, then EVAL
// when the node does not know it), no keys: it touches none.
func (s *Store) runCheck(ctx context.Context, c rueidis.Client, argv []string) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.connTimeout())
	defer cancel()
	r := c.Do(ctx, c.B().Evalsha().Sha1(aclCheckScript.sha).Numkeys(0).Arg(argv...).Build())
	if e, ok := rueidis.IsRedisErr(r.Error()); ok && e.IsNoScript() {
		r = c.Do(ctx, c.B().Eval().Script(aclCheckScript.text).Numkeys(0).Arg(argv...).Build())
	}
	arr, err := r.ToArray()
	if err != nil {
		return nil, err
	}
	out := make([]int64, 0, len(arr))
	for _, v := range arr {
		i, err := v.AsInt64()
		if err != nil {
			return nil, fmt.Errorf("redis: permission check returned %v", v)
		}
		out = append(out, i)
	}
	return out, nil
}
