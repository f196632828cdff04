package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// writePKI writes a CA and two leaf certificates signed by it into dir:
// ca.crt, server.crt/key (for "localhost" and 127.0.0.1) and
// client.crt/key, as Envoy Gateway mounts them under /certs.
func writePKI(t *testing.T, dir string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write("ca.crt", "CERTIFICATE", caDER)
	for i, name := range []string{"server", "client"} {
		k := newKey()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: name},
			DNSNames: []string{"localhost", name}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		write(name+".crt", "CERTIFICATE", der)
		write(name+".key", "EC PRIVATE KEY", kd)
	}
}

// TestRunRatelimitXDS is Envoy Gateway's path end to end: the drop-in
// gets its configuration from an ADS server (go-control-plane's snapshot
// cache and server, TLS 1.3, client certificate required), and serves
// RLS over TLS with client certificates required, as Envoy Gateway runs
// it.
func TestRunRatelimitXDS(t *testing.T) {
	redis := redistest.Start(t)
	certs := t.TempDir()
	writePKI(t, certs)
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(filepath.Join(certs, "ca.crt"))
	pool.AppendCertsFromPEM(caPEM)
	serverKP, err := tls.LoadX509KeyPair(filepath.Join(certs, "server.crt"), filepath.Join(certs, "server.key"))
	if err != nil {
		t.Fatal(err)
	}
	clientKP, err := tls.LoadX509KeyPair(filepath.Join(certs, "client.crt"), filepath.Join(certs, "client.key"))
	if err != nil {
		t.Fatal(err)
	}

	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	snap, err := cachev3.NewSnapshot("1", map[resource.Type][]types.Resource{resource.RateLimitConfigType: {
		&rlsconf.RateLimitConfig{Name: "gw", Domain: "default/eg/http", Descriptors: []*rlsconf.RateLimitDescriptor{{
			Key: "rule-0", RateLimit: &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_HOUR, RequestsPerUnit: 2}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.SetSnapshot(context.Background(), "envoy-ratelimit", snap); err != nil {
		t.Fatal(err)
	}
	xctx, xcancel := context.WithCancel(context.Background())
	defer xcancel()
	xs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{serverKP},
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(xs, serverv3.NewServer(xctx, cache, nil))
	xl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = xs.Serve(xl) }()
	defer xs.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listening := make(chan [2]string, 1)
	errc := make(chan error, 1)
	c := func(name string) string { return filepath.Join(certs, name) }
	go func() {
		errc <- runRatelimit(ctx, envOf("HOST", "127.0.0.1", "PORT", "0", "GRPC_HOST", "127.0.0.1", "GRPC_PORT", "0",
			"DEBUG_HOST", "127.0.0.1", "DEBUG_PORT", "0", "USE_STATSD", "false", "REDIS_SOCKET_TYPE", "tcp",
			"REDIS_URL", redis.Addr, "REDIS_TIMEOUT", "5s",
			"CONFIG_TYPE", "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL", xl.Addr().String(), "CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit",
			"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", c("client.crt"),
			"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", c("client.key"), "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", c("ca.crt"),
			"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "localhost",
			"GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", c("server.crt"), "GRPC_SERVER_TLS_KEY", c("server.key"),
			"GRPC_CLIENT_TLS_CACERT", c("ca.crt")), &lockedLog{}, listening)
	}()
	var grpcAddr, httpURL string
	select {
	case a := <-listening:
		grpcAddr, httpURL = a[0], "http://"+a[1]
	case err := <-errc:
		t.Fatalf("runRatelimit: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not listening within 30 s (no configuration from xDS?)")
	}
	// As Envoy Gateway's readiness probe does: calls before Redis answers
	// are UNAVAILABLE by design (seen on a loaded machine).
	waitFor(t, "/healthcheck 200", func() bool { code, _ := get(t, httpURL+"/healthcheck"); return code == http.StatusOK })
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost",
		Certificates: []tls.Certificate{clientKP}})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rc := rlsv3.NewRateLimitServiceClient(conn)
	var codes []rlsv3.RateLimitResponse_Code
	for range 3 {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := rc.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "rule-0", Value: "rule-0"}}}}})
		ccancel()
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.GetOverallCode())
	}
	if codes[0] != rlsv3.RateLimitResponse_OK || codes[1] != rlsv3.RateLimitResponse_OK || codes[2] != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("codes %v, want OK OK OVER_LIMIT (2 an hour from xDS)", codes)
	}

	// Without a client certificate the RLS listener refuses the call.
	anon, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost"})))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer acancel()
	if _, err := rlsv3.NewRateLimitServiceClient(anon).ShouldRateLimit(actx, &rlsv3.RateLimitRequest{Domain: "default/eg/http",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "rule-0", Value: "x"}}}}}); err == nil {
		t.Error("a call without a client certificate was answered")
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("runRatelimit after shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("runRatelimit did not return within 10 s of shutdown")
	}
}

// TestServerTLSReload: a new certificate, key and client CA written over
// the files are used from the next handshake on; a file that disappears
// mid-rotation keeps the last good ones.
func TestServerTLSReload(t *testing.T) {
	dir := t.TempDir()
	writePKI(t, dir)
	f := func(n string) string { return filepath.Join(dir, n) }
	st, err := rls.NewServerTLS(rls.TLSFiles{Cert: f("server.crt"), Key: f("server.key"), ClientCA: f("ca.crt")})
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.Config()
	current := func() ([]byte, *x509.CertPool) {
		t.Helper()
		_, _ = st.ReloadIfChanged() // the drop-in's watchTLS, polled once
		c, err := cfg.GetConfigForClient(nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.ClientAuth != tls.RequireAndVerifyClientCert {
			t.Errorf("client auth %v, want RequireAndVerifyClientCert", c.ClientAuth)
		}
		return c.Certificates[0].Certificate[0], c.ClientCAs
	}
	leaf1, pool1 := current()
	if again, _ := current(); string(again) != string(leaf1) {
		t.Fatal("the certificate changed with no file changed")
	}
	// Another CA and leaves; the files' times move on (set explicitly, so
	// that a coarse file-system clock cannot hide the change).
	writePKI(t, dir)
	later := time.Now().Add(time.Minute)
	for _, n := range []string{"server.crt", "server.key", "ca.crt"} {
		if err := os.Chtimes(f(n), later, later); err != nil {
			t.Fatal(err)
		}
	}
	leaf2, pool2 := current()
	if string(leaf2) == string(leaf1) {
		t.Error("the new certificate is not served")
	}
	if pool2.Equal(pool1) {
		t.Error("the new client CA is not used")
	}
	if err := os.Remove(f("server.crt")); err != nil {
		t.Fatal(err)
	}
	if leaf3, _ := current(); string(leaf3) != string(leaf2) {
		t.Error("mid-rotation (a file missing) the last good certificate is not kept")
	}
}

// TestServerTLSClientSAN: with GRPC_CLIENT_TLS_SAN the client certificate
// must carry that name besides chaining to the client CA.
func TestServerTLSClientSAN(t *testing.T) {
	dir := t.TempDir()
	writePKI(t, dir)
	f := func(n string) string { return filepath.Join(dir, n) }
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(f("ca.crt"))
	pool.AppendCertsFromPEM(caPEM)
	clientKP, err := tls.LoadX509KeyPair(f("client.crt"), f("client.key"))
	if err != nil {
		t.Fatal(err)
	}
	handshake := func(san string) error {
		st, err := rls.NewServerTLS(rls.TLSFiles{Cert: f("server.crt"), Key: f("server.key"), ClientCA: f("ca.crt"), ClientSAN: san})
		if err != nil {
			t.Fatal(err)
		}
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		srv := tls.Server(a, st.Config())
		errc := make(chan error, 1)
		go func() { errc <- srv.Handshake(); a.Close() }()
		cl := tls.Client(b, &tls.Config{RootCAs: pool, ServerName: "localhost", Certificates: []tls.Certificate{clientKP}})
		_ = cl.Handshake()
		b.Close() // a server alert written to the pipe finds no reader otherwise
		return <-errc
	}
	if err := handshake("client"); err != nil {
		t.Errorf("a client certificate carrying the name: %v", err)
	}
	if err := handshake("someone-else"); err == nil {
		t.Error("a client certificate without the name was accepted")
	}
}
