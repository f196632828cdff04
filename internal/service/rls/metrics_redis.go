package rls

// The Redis round trips' metrics and the causes of their failures.

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/tokengate/tokengate/internal/service/redisstore"
)

// ObserveRedis records one pipelined round trip to Redis; the
// redisstore.Store calls it (redisstore.Options.Observe). A failure is
// counted by cause and node and logged (SetErrorLog).
func (m *Metrics) ObserveRedis(d time.Duration, err error) {
	m.redisDuration.Observe(d.Seconds())
	if err == nil {
		return
	}
	cause, node := RedisCause(err)
	if node == "" {
		if n := m.node.Load(); n != nil {
			node = *n
		}
	}
	m.redisErrors.WithLabelValues(cause, node).Inc()
	if l := m.errLog.Load(); l != nil {
		l.Error("redis round trip failed", "redis "+cause+" "+node, "cause", cause, "node", node, "error", err.Error())
	}
}

// RedisCause classifies a Redis failure for tokengate_rls_redis_errors_total:
// its cause and, when the error names it, the node's address.
//
//	timeout        the round trip's bound (-redis-timeout) or the caller's deadline passed
//	canceled       the caller went away
//	not_connected  no connection yet (the store is still connecting)
//	connection     a network error: refused, reset, closed
//	<prefix>       Redis answered an error: its prefix in lower case
//	               (clusterdown, loading, readonly, oom, noscript, err ...)
//	other          anything else
func RedisCause(err error) (cause, node string) {
	var op *net.OpError
	if errors.As(err, &op) && op.Addr != nil {
		node = op.Addr.String()
	}
	if re, ok := rueidis.IsRedisErr(err); ok {
		if addr, ok := re.IsMoved(); ok {
			return "moved", addr
		}
		if addr, ok := re.IsAsk(); ok {
			return "ask", addr
		}
		return redisPrefix(re.Error()), node
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout", node
	case errors.Is(err, context.Canceled):
		return "canceled", node
	case errors.Is(err, redisstore.ErrNotConnected):
		return "not_connected", node
	case errors.Is(err, redisstore.ErrBacklog):
		return "not_answering", node
	case op != nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, rueidis.ErrClosing):
		return "connection", node
	}
	var ne net.Error
	if errors.As(err, &ne) {
		if ne.Timeout() {
			return "timeout", node
		}
		return "connection", node
	}
	return "other", node
}

// redisPrefix is a Redis error reply's first word in lower case when it
// is one (upper-case letters, at most 16), else "redis_error": the label
// stays within Redis's vocabulary.
func redisPrefix(msg string) string {
	w, _, _ := strings.Cut(msg, " ")
	if w == "" || len(w) > 16 {
		return "redis_error"
	}
	for i := 0; i < len(w); i++ {
		if w[i] < 'A' || w[i] > 'Z' {
			return "redis_error"
		}
	}
	return strings.ToLower(w)
}
