package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/rueidis"
)

// clusterSlots is 16384, the hash slots of a Redis Cluster.
const clusterSlots = 16384

// topology is a cluster's slot map as CLUSTER SLOTS gave it: the master of
// every slot ("" for a slot no master serves).
type topology struct {
	master [clusterSlots]string
}

// masters returns the distinct masters of t and whether every slot has one.
func (t *topology) masters() (addrs []string, full bool) {
	seen := map[string]bool{}
	full = true
	for _, a := range t.master {
		if a == "" {
			full = false
			continue
		}
		if !seen[a] {
			seen[a] = true
			addrs = append(addrs, a)
		}
	}
	return addrs, full
}

// readTopology reads the slot map with CLUSTER SLOTS, asking the nodes
// rueidis knows in turn until one answers: a dead node, replica or not,
// does not stop it.
func (s *Store) readTopology(ctx context.Context, c rueidis.Client) (*topology, error) {
	var errs []error
	for _, n := range c.Nodes() {
		t, err := s.readTopologyFrom(ctx, n)
		if err == nil {
			return t, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, errors.New("redis: no cluster node known")
	}
	return nil, errors.Join(errs...)
}

func (s *Store) readTopologyFrom(ctx context.Context, c rueidis.Client) (*topology, error) {
	ctx, cancel := context.WithTimeout(ctx, s.connTimeout())
	defer cancel()
	ranges, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, err
	}
	t := &topology{}
	for _, r := range ranges {
		f, err := r.ToArray()
		if err != nil || len(f) < 3 {
			return nil, fmt.Errorf("redis: CLUSTER SLOTS: unexpected entry %v", r)
		}
		lo, err1 := f[0].AsInt64()
		hi, err2 := f[1].AsInt64()
		node, err3 := f[2].ToArray()
		if err := errors.Join(err1, err2, err3); err != nil || len(node) < 2 || lo < 0 || hi >= clusterSlots || lo > hi {
			return nil, fmt.Errorf("redis: CLUSTER SLOTS: unexpected entry %v", r)
		}
		host, _ := node[0].ToString()
		port, err := node[1].AsInt64()
		if err != nil {
			return nil, fmt.Errorf("redis: CLUSTER SLOTS: unexpected entry %v", r)
		}
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		for i := lo; i <= hi; i++ {
			t.master[i] = addr
		}
	}
	return t, nil
}

// refreshTopology reads the cluster's slot map and points each slot at
// its master's lane (guard.go). On an error it keeps the map it had.
func (s *Store) refreshTopology() {
	cp := s.client.Load()
	if cp == nil {
		return
	}
	t, err := s.readTopology(context.Background(), *cp)
	if err != nil {
		return
	}
	slots := make([]*lane, clusterSlots)
	for i, a := range t.master {
		if a == "" {
			continue
		}
		l := s.lanes.byAddr[a]
		if l == nil {
			l = &lane{s: s}
			s.lanes.byAddr[a] = l
			addr := a
			l.watch(func(ctx context.Context) error {
				n, ok := (*cp).Nodes()[addr]
				if !ok {
					return fmt.Errorf("redis: master %s: not connected", addr)
				}
				return n.Do(ctx, n.B().Ping().Build()).Error()
			})
		}
		slots[i] = l
	}
	s.lanes.slots.Store(&slots)
}

// Ping reports whether the store can decide every key now: the node
// answers PING (one node), the master the Sentinels name answers PING
// (Sentinel), or every slot of the cluster has a master and each master
// answers PING (Cluster). Replicas are not asked: the store never uses
// them. Each PING is bounded by the connection timeout (pingGap), longer
// than a call's, so that a busy host does not flap readiness. Then the
// user's permissions are checked on each of those nodes (acl.go): an
// error wrapping ErrPermission names what it may not run.
func (s *Store) Ping(ctx context.Context) error {
	cp := s.client.Load()
	if cp == nil {
		if e := s.connectErr.Load(); e != nil {
			return fmt.Errorf("%w: %v", ErrNotConnected, *e)
		}
		return ErrNotConnected
	}
	c := *cp
	if !s.opt.Cluster {
		pctx, cancel := context.WithTimeout(ctx, s.connTimeout())
		defer cancel()
		if err := c.Do(pctx, c.B().Ping().Build()).Error(); err != nil {
			return err
		}
		return s.checkPerms(ctx, map[string]rueidis.Client{strings.Join(s.opt.Addrs, ","): c})
	}
	t, err := s.readTopology(ctx, c)
	if err != nil {
		return fmt.Errorf("redis: cluster slot map: %w", err)
	}
	masters, full := t.masters()
	if !full {
		return errors.New("redis: cluster: some slots have no master")
	}
	nodes := c.Nodes()
	errs := make([]error, len(masters))
	var wg sync.WaitGroup
	for i, a := range masters {
		n, ok := nodes[a]
		if !ok {
			errs[i] = fmt.Errorf("redis: master %s: not connected", a)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(ctx, s.connTimeout())
			defer cancel()
			if err := n.Do(ctx, n.B().Ping().Build()).Error(); err != nil {
				errs[i] = fmt.Errorf("redis: master %s: %w", a, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	check := make(map[string]rueidis.Client, len(masters))
	for _, a := range masters {
		check[a] = nodes[a]
	}
	return s.checkPerms(ctx, check)
}
