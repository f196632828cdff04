package rlsxds_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokengate/tokengate/internal/service/dropin/rlsxds"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// adsServer is go-control-plane's snapshot cache and server on
// 127.0.0.1, as Envoy Gateway runs them, recording the requests it gets.
type adsServer struct {
	addr  string
	cache cachev3.SnapshotCache
	mu    sync.Mutex
	reqs  []*discoveryv3.DiscoveryRequest
}

func startADS(t *testing.T, creds credentials.TransportCredentials) *adsServer {
	t.Helper()
	a := &adsServer{cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.reqs = append(a.reqs, r)
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	gs := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(ctx, a.cache, cb))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	a.addr = l.Addr().String()
	return a
}

func (a *adsServer) set(t *testing.T, version string, cfgs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	rs := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		rs[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.cache.SetSnapshot(context.Background(), "gw", snap); err != nil {
		t.Fatal(err)
	}
}

// nack returns the error of the first NACK of version, or "".
func (a *adsServer) nack() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.reqs {
		if r.GetErrorDetail() != nil {
			return r.GetErrorDetail().GetMessage()
		}
	}
	return ""
}

func (a *adsServer) acked(version string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.reqs {
		if r.GetErrorDetail() == nil && r.GetVersionInfo() == version && r.GetResponseNonce() != "" {
			return true
		}
	}
	return false
}

func domain(name string, n uint32) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: name, Domain: name, Descriptors: []*rlsconf.RateLimitDescriptor{{
		Key: "k", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_MINUTE, RequestsPerUnit: n},
		Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "sub", Value: "v", ShadowMode: true,
			RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 1, Name: "sub", Replaces: []*rlsconf.RateLimitReplace{{Name: "x"}}}}},
	}}}
}

// configs collects what the client puts in force.
type configs struct {
	mu   sync.Mutex
	last *rls.Config
	n    int
}

func (c *configs) set(cfg *rls.Config) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last, c.n = cfg, c.n+1
}

func (c *configs) domains() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		return "<none>"
	}
	return strings.Join(c.last.Domains(), ",")
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 15 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// run starts the client on conn until the test ends.
func run(t *testing.T, conn *grpc.ClientConn, got *configs) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		rlsxds.Run(ctx, rlsxds.Options{Conn: conn, NodeID: "gw", Set: got.set, Backoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// exercise: a snapshot is put in force and ACKed, a new version replaces
// the whole configuration, a bad one is NACKed with its reason and the
// configuration in force kept.
func exercise(t *testing.T, a *adsServer, got *configs) {
	t.Helper()
	a.set(t, "1", domain("alpha", 5), domain("beta", 2))
	waitFor(t, "version 1 in force", func() bool { return got.domains() == "alpha,beta" })
	waitFor(t, "version 1 ACKed", func() bool { return a.acked("1") })

	a.set(t, "2", domain("gamma", 1))
	waitFor(t, "version 2 replaces version 1", func() bool { return got.domains() == "gamma" })
	waitFor(t, "version 2 ACKed", func() bool { return a.acked("2") })

	bad := domain("delta", 1)
	bad.Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	a.set(t, "3", bad)
	waitFor(t, "version 3 NACKed", func() bool { return a.nack() != "" })
	if msg := a.nack(); !strings.Contains(msg, "unit") {
		t.Errorf("NACK message %q, want it to name the unit", msg)
	}
	if d := got.domains(); d != "gamma" {
		t.Errorf("after a NACK: domains %s, want gamma (kept)", d)
	}
	if a.acked("3") {
		t.Error("version 3 ACKed")
	}
}

func TestADSPlaintext(t *testing.T) {
	a := startADS(t, nil)
	conn, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := &configs{}
	run(t, conn, got)
	exercise(t, a, got)
}

// TestADSTLS: as Envoy Gateway serves it, TLS 1.3 with a client
// certificate required. Without one the client gets nothing; with one
// it gets every version.
func TestADSTLS(t *testing.T) {
	pki := newPKI(t)
	a := startADS(t, credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pki.server},
		ClientCAs: pki.pool, ClientAuth: tls.RequireAndVerifyClientCert}))

	anon, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pki.pool, ServerName: "xds.test"})))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	refused := &configs{}
	run(t, anon, refused)

	conn, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pki.pool, ServerName: "xds.test",
		Certificates: []tls.Certificate{pki.client}})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := &configs{}
	run(t, conn, got)
	exercise(t, a, got)
	if d := refused.domains(); d != "<none>" {
		t.Errorf("a client without a certificate got %s", d)
	}
}

// TestReconnect: when the management server goes away and comes back
// on the same address, the client subscribes again and gets what it
// serves then.
func TestReconnect(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	serve := func(version string, cfg *rlsconf.RateLimitConfig) func() {
		cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
		snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: {cfg}})
		if err != nil {
			t.Fatal(err)
		}
		if err := cache.SetSnapshot(context.Background(), "gw", snap); err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(context.Background(), cache, nil))
		var l net.Listener
		for i := 0; ; i++ { // the port was just free; retry briefly if the kernel holds it
			if l, err = net.Listen("tcp", addr); err == nil || i == 100 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = gs.Serve(l) }()
		return gs.Stop
	}
	stop := serve("1", domain("one", 1))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := &configs{}
	run(t, conn, got)
	waitFor(t, "the first server's configuration", func() bool { return got.domains() == "one" })
	stop()
	stop = serve("7", domain("two", 1))
	defer stop()
	waitFor(t, "the second server's configuration", func() bool { return got.domains() == "two" })
}

type pki struct {
	pool           *x509.CertPool
	server, client tls.Certificate
}

func newPKI(t *testing.T) pki {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage, names ...string) tls.Certificate {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "leaf"}, DNSNames: names,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pki{pool: pool, server: leaf(2, x509.ExtKeyUsageServerAuth, "xds.test"), client: leaf(3, x509.ExtKeyUsageClientAuth, "ratelimit")}
}
