package redistest

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on 127.0.0.1 in front of a Redis node, for the
// fault a dead peer or a broken network gives: Stall makes it stop
// forwarding (it keeps every connection open and reads nothing more, so
// the client's writes pile up in socket buffers and no answer comes), and
// Resume makes it forward again. It is closed when the test ends.
type Proxy struct {
	// Addr is the proxy's "127.0.0.1:port".
	Addr string

	l      net.Listener
	target string
	mu     sync.Mutex
	stall  chan struct{} // closed when forwarding may go on
	delay  time.Duration
	conns  []net.Conn
	wg     sync.WaitGroup
}

// StartProxy starts a proxy forwarding to target.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy: %v", err)
	}
	p := &Proxy{Addr: l.Addr().String(), l: l, target: target, stall: make(chan struct{})}
	close(p.stall)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(u, c)
		go p.pipe(c, u)
	}
}

// pipe copies from src to dst, waiting before each read while stalled,
// and holding each chunk until the delay after it was read (a latency,
// not a throughput limit: chunks read meanwhile wait alongside).
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 1024)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer dst.Close()
		for c := range q {
			time.Sleep(time.Until(c.at))
			if _, err := dst.Write(c.b); err != nil {
				for range q {
				}
				return
			}
		}
	}()
	defer close(q)
	for {
		p.mu.Lock()
		gate := p.stall
		p.mu.Unlock()
		<-gate
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate, d := p.stall, p.delay
			p.mu.Unlock()
			<-gate // stalled while reading: hold what was read
			q <- chunk{buf[:n], time.Now().Add(d)}
		}
		if err != nil {
			return
		}
	}
}

// Delay makes the proxy hold everything it forwards for d before sending
// it on (0: none): a Redis, or a network, slower than a call's timeout
// but answering.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Stall stops forwarding in both directions, on open and new
// connections alike, until Resume.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.stall:
		p.stall = make(chan struct{})
	default:
	}
}

// Resume forwards again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.stall:
	default:
		close(p.stall)
	}
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.l.Close()
	p.Resume()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
