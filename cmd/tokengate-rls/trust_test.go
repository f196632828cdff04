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
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// writerPKI is a CA, a server certificate for 127.0.0.1 and client
// certificates issued on demand with the URI SANs asked for.
type writerPKI struct {
	caFile, certFile, keyFile string
	pool                      *x509.CertPool
	ca                        *x509.Certificate
	caKey                     *ecdsa.PrivateKey
	serial                    int64
}

func newWriterPKI(t *testing.T) *writerPKI {
	t.Helper()
	dir := t.TempDir()
	p := &writerPKI{caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "cert.pem"), keyFile: filepath.Join(dir, "key.pem"),
		pool: x509.NewCertPool(), serial: 1}
	p.caKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "writer test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.ca, _ = x509.ParseCertificate(der)
	p.pool.AddCert(p.ca)
	writeFile(t, p.caFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	c, k := p.leaf(t, x509.ExtKeyUsageServerAuth)
	writeFile(t, p.certFile, string(c))
	if err := os.WriteFile(p.keyFile, k, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// leaf issues a certificate for 127.0.0.1 with the URI SANs uris.
func (p *writerPKI) leaf(t *testing.T, usage x509.ExtKeyUsage, uris ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	p.serial++
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(k)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// client returns a TLS configuration presenting a client certificate with
// the URI SANs uris (none: no certificate at all when bare).
func (p *writerPKI) client(t *testing.T, bare bool, uris ...string) *tls.Config {
	t.Helper()
	c := &tls.Config{RootCAs: p.pool}
	if bare {
		return c
	}
	cp, kp := p.leaf(t, x509.ExtKeyUsageClientAuth, uris...)
	cert, err := tls.X509KeyPair(cp, kp)
	if err != nil {
		t.Fatal(err)
	}
	c.Certificates = []tls.Certificate{cert}
	return c
}

// writerConfig has a rule that settles after the response.
const writerConfig = `{"rules":[{"name":"llm","scope":"cluster","limit_keys":["header:x-api-key"],
  "algorithm_config":{"tokens_per_second":1e-6,"burst":1000,"cost_source":"response_json:/usage/total_tokens","pre_charge":0}}],
 "settings":{"rls":{"cluster":"ratelimit"}}}`

// TestWriterCertificates: with -tls-client-ca, -tls-client-optional and
// -tls-writer-uri-prefix, a proxy whose client certificate names a SPIFFE
// ID under the prefix settles (a reset deletes the spent key); a
// certificate of the same CA naming another workload is PERMISSION_DENIED
// and one without a certificate UNAUTHENTICATED, and neither changes the
// bucket; the certificate-less caller still gets plain decisions.
func TestWriterCertificates(t *testing.T) {
	pki := newWriterPKI(t)
	redis := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, writerConfig)
	addr, admin := startRun(t, io.Discard, "-config", cfg, "-redis", redis.Addr, "-redis-timeout", "5s", "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0",
		"-tls-cert", pki.certFile, "-tls-key", pki.keyFile, "-tls-client-ca", pki.caFile, "-tls-client-optional",
		"-tls-writer-uri-prefix", "spiffe://cluster.local/ns/edge/")
	call := func(c *tls.Config, settle bool, d *ratelimitv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// One stream, whose admissions and settlements carry its receipt
		// id (docs/rls.md#receipts).
		ctx = metadata.AppendToOutgoingContext(ctx, rlscontract.ReceiptHeader, "cmd0000000000001")
		if settle {
			ctx = metadata.AppendToOutgoingContext(ctx, rlscontract.SettleHeader, "1")
		}
		return rlsv3.NewRateLimitServiceClient(tlsConn(t, addr, c)).ShouldRateLimit(ctx,
			&rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	}
	entries := func(kv ...string) *ratelimitv3.RateLimitDescriptor {
		d := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return d
	}
	plain := entries(rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "k")
	reset := entries(rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "k", rlscontract.SettleKey, "reset")

	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code, _ := get(t, admin+"/ready"); code == 200 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("not ready after 20 s")
		}
	}
	anon := pki.client(t, true)
	for range 2 {
		if r, err := call(anon, false, plain); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("a plain decision without a certificate: %v %v", r, err)
		}
	}
	tokens := func() string {
		v, err := redis.Do("GET", "tb:{llm:k}")
		if err != nil || v == nil {
			return ""
		}
		return strings.SplitN(v.(string), ":", 2)[0]
	}
	if got := tokens(); got != "998.000000" {
		t.Fatalf("after two takes: %q, want 998", got)
	}
	for _, tc := range []struct {
		name string
		c    *tls.Config
		want codes.Code
	}{
		{"no certificate", anon, codes.Unauthenticated},
		{"another workload", pki.client(t, false, "spiffe://cluster.local/ns/other/sa/attacker"), codes.PermissionDenied},
		{"no URI", pki.client(t, false), codes.PermissionDenied},
	} {
		if _, err := call(tc.c, true, reset); status.Code(err) != tc.want {
			t.Errorf("%s: reset got %v, want %v", tc.name, err, tc.want)
		}
		if got := tokens(); got != "998.000000" {
			t.Fatalf("%s: a refused reset changed the bucket: %q", tc.name, got)
		}
	}
	if _, err := call(pki.client(t, false, "spiffe://cluster.local/ns/edge/sa/envoy"), true, reset); err != nil {
		t.Fatalf("the proxy's reset: %v", err)
	}
	if got := tokens(); got != "" {
		t.Errorf("after the proxy's reset: %q, want no key", got)
	}
}

// TestTrustFlags: contradictory or incomplete trust flags are refused at
// start, and a credential file's bad line is named without its content.
func TestTrustFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rls.json")
	writeFile(t, cfg, writerConfig)
	good := filepath.Join(dir, "good")
	writeFile(t, good, "a-credential-of-twenty-four\n")
	bad := filepath.Join(dir, "bad")
	writeFile(t, bad, "a-credential-of-twenty-four\n\nshort-secret\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-allow-unauthenticated-writes", "-credential-file", good}, "contradicts"},
		{[]string{"-tls-client-optional"}, "need -tls-client-ca"},
		{[]string{"-tls-writer-uri-prefix", "spiffe://x/"}, "need -tls-client-ca"},
		{[]string{"-credential-file", bad}, bad + ": line 3: a credential is 16 to 256 visible ASCII characters"},
		{[]string{"-credential-file", filepath.Join(dir, "missing")}, "no such file"},
	} {
		err := run(context.Background(), append([]string{"-config", cfg, "-redis", "127.0.0.1:1"}, tc.args...), io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "short-secret") {
			t.Errorf("%q: got %v, want an error with %q (and no secret)", tc.args, err, tc.want)
		}
	}
}
