package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// The admin API's Redis calls (docs/rls.md, "Admin API"): a key's
// override (OverrideKey), a hash of a few numeric fields read by the
// decision scripts in the same script call as the bucket or the quota
// they override, and the reads of the usage endpoint. Each is one round trip bounded by the
// store's timeout, like a decision's.

// setOverrideLua replaces the hash KEYS[1] with the field/value pairs
// ARGV[2..] and gives it an expiry of ARGV[1] milliseconds (0: none), in
// one step: no replica ever reads half an override.
var setOverrideLua = `redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
local ttl = tonumber(ARGV[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
`

// Field is one field of an override hash and its value.
type Field struct {
	Name  string
	Value float64
}

// SetOverride makes the hash key hold exactly fields (at least one),
// replacing what it held, with an expiry of ttl (0: none; rounded to the
// millisecond).
func (s *Store) SetOverride(ctx context.Context, key string, fields []Field, ttl time.Duration) error {
	if len(fields) == 0 {
		return errors.New("redis: an override needs a field")
	}
	args := make([]string, 0, 1+2*len(fields))
	args = append(args, strconv.FormatInt(ttl.Milliseconds(), 10))
	for _, f := range fields {
		args = append(args, f.Name, Num(f.Value))
	}
	_, err := s.adminDo(ctx, func(c rueidis.Client) rueidis.Completed {
		return c.B().Eval().Script(setOverrideLua).Numkeys(1).Key(key).Arg(args...).Build()
	})
	return err
}

// DeleteOverride removes the hash key and reports whether it existed.
func (s *Store) DeleteOverride(ctx context.Context, key string) (bool, error) {
	r, err := s.adminDo(ctx, func(c rueidis.Client) rueidis.Completed { return c.B().Del().Key(key).Build() })
	if err != nil {
		return false, err
	}
	n, err := r.AsInt64()
	return n > 0, err
}

// Hash is a Redis hash as read: its fields (empty when the key does not
// exist) and the milliseconds until it expires (< 0: no expiry or no key).
type Hash struct {
	Fields map[string]string
	TTL    time.Duration
}

// ReadHashes reads the hashes keys (HGETALL and PTTL each), in one
// pipeline: keys of one hash tag are read from one node in one round trip.
func (s *Store) ReadHashes(ctx context.Context, keys ...string) ([]Hash, error) {
	out := make([]Hash, len(keys))
	rs, err := s.adminMulti(ctx, func(c rueidis.Client) rueidis.Commands {
		cmds := make(rueidis.Commands, 0, 2*len(keys))
		for _, k := range keys {
			cmds = append(cmds, c.B().Hgetall().Key(k).Build(), c.B().Pttl().Key(k).Build())
		}
		return cmds
	})
	if err != nil {
		return nil, err
	}
	for i := range keys {
		m, err := rs[2*i].AsStrMap()
		if err != nil {
			return nil, fmt.Errorf("redis: HGETALL %s: %w", keys[i], err)
		}
		ms, err := rs[2*i+1].AsInt64()
		if err != nil {
			return nil, fmt.Errorf("redis: PTTL %s: %w", keys[i], err)
		}
		out[i] = Hash{Fields: m, TTL: time.Duration(ms) * time.Millisecond}
	}
	return out, nil
}

// ReadString reads the string key (GET): "" and false when it does not
// exist.
func (s *Store) ReadString(ctx context.Context, key string) (string, bool, error) {
	r, err := s.adminDo(ctx, func(c rueidis.Client) rueidis.Completed { return c.B().Get().Key(key).Build() })
	if err != nil {
		if rueidis.IsRedisNil(err) {
			return "", false, nil
		}
		return "", false, err
	}
	v, err := r.ToString()
	return v, err == nil, err
}

// adminDo sends one command, built for the client in use, as a Lease call
// sends its script (bounded by the store's timeout, not sent to a node
// that does not answer), and returns its answer or its error.
func (s *Store) adminDo(ctx context.Context, build func(c rueidis.Client) rueidis.Completed) (rueidis.RedisMessage, error) {
	cp := s.client.Load()
	if cp == nil {
		s.observe(0, ErrNotConnected)
		return rueidis.RedisMessage{}, ErrNotConnected
	}
	c := *cp
	start := time.Now()
	ctx, cancel := s.bound(ctx, start)
	defer cancel()
	r, err := s.doOne(ctx, c, build(c))
	if err == nil {
		err = r.Error()
	}
	if err != nil && !rueidis.IsRedisNil(err) {
		s.observe(time.Since(start), err)
		return rueidis.RedisMessage{}, err
	}
	s.observe(time.Since(start), nil)
	if err != nil {
		return rueidis.RedisMessage{}, err
	}
	return r.ToMessage()
}

// adminMulti sends the commands build returns in one pipeline, as adminDo
// sends one, and returns their answers: the first error fails the whole.
func (s *Store) adminMulti(ctx context.Context, build func(c rueidis.Client) rueidis.Commands) ([]rueidis.RedisMessage, error) {
	cp := s.client.Load()
	if cp == nil {
		s.observe(0, ErrNotConnected)
		return nil, ErrNotConnected
	}
	c := *cp
	start := time.Now()
	ctx, cancel := s.bound(ctx, start)
	defer cancel()
	cmds := build(c)
	idx := make([]int, len(cmds))
	for i := range idx {
		idx[i] = i
	}
	out := make([]rueidis.RedisMessage, len(cmds))
	var first error
	s.do(ctx, cmds, idx, func(i int, r rueidis.RedisResult, err error) {
		if err == nil {
			out[i], err = r.ToMessage()
		}
		if err != nil && first == nil {
			first = err
		}
	})
	s.observe(time.Since(start), first)
	return out, first
}
