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
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files.
type testPKI struct {
	caFile, certFile, keyFile string
	pool                      *x509.CertPool
	client                    tls.Certificate
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage) ([]byte, []byte) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "leaf"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, _ := x509.MarshalECPrivateKey(k)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
	}
	p := &testPKI{caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "cert.pem"), keyFile: filepath.Join(dir, "key.pem"),
		pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	_ = os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644)
	c, k := leaf(2, x509.ExtKeyUsageServerAuth)
	_ = os.WriteFile(p.certFile, c, 0o644)
	_ = os.WriteFile(p.keyFile, k, 0o600)
	cc, ck := leaf(3, x509.ExtKeyUsageClientAuth)
	if p.client, err = tls.X509KeyPair(cc, ck); err != nil {
		t.Fatal(err)
	}
	return p
}

func tlsConn(t *testing.T, addr string, c *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(c)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestTLS: the gRPC listener speaks TLS with -tls-cert and -tls-key, and
// with -tls-client-ca refuses a client without a certificate (counted)
// and serves one with a certificate the CA signed.
func TestTLS(t *testing.T) {
	pki := newPKI(t)
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, configJSON)
	base := []string{"-config", cfg, "-redis", "127.0.0.1:1", "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0",
		"-tls-cert", pki.certFile, "-tls-key", pki.keyFile}

	t.Run("server", func(t *testing.T) {
		addr, _ := startRun(t, io.Discard, base...)
		if st, err := healthCheck(t, tlsConn(t, addr, &tls.Config{RootCAs: pki.pool}), ""); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health over TLS: %v %v", st, err)
		}
		plain, _ := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		defer plain.Close()
		if _, err := healthCheck(t, plain, ""); status.Code(err) != codes.Unavailable {
			t.Errorf("plaintext call to a TLS listener: %v, want Unavailable", err)
		}
	})
	t.Run("client certificates", func(t *testing.T) {
		addr, admin := startRun(t, io.Discard, append(base, "-tls-client-ca", pki.caFile)...)
		_, err := healthCheck(t, tlsConn(t, addr, &tls.Config{RootCAs: pki.pool}), "")
		if status.Code(err) != codes.Unavailable {
			t.Errorf("no client certificate: %v, want Unavailable (refused in the handshake)", err)
		}
		if st, err := healthCheck(t, tlsConn(t, addr, &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.client}}), ""); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("with a client certificate: %v %v", st, err)
		}
		_, m := get(t, admin+"/metrics")
		if !strings.Contains(m, "tokengate_rls_tls_handshake_errors_total ") || strings.Contains(m, "tokengate_rls_tls_handshake_errors_total 0\n") {
			t.Errorf("refused handshake not counted:\n%s", m)
		}
	})
	t.Run("flags", func(t *testing.T) {
		for _, args := range [][]string{{"-tls-cert", pki.certFile}, {"-tls-client-ca", pki.caFile}} {
			if err := run(context.Background(), append([]string{"-config", cfg}, args...), io.Discard, nil); err == nil || !strings.Contains(err.Error(), "go together") {
				t.Errorf("%q: %v", args, err)
			}
		}
		err := run(context.Background(), []string{"-config", cfg, "-tls-cert", cfg, "-tls-key", cfg}, io.Discard, nil)
		if err == nil {
			t.Error("a JSON file as certificate: no error")
		}
	})
}

// TestTLSReload: a new certificate written over the files serves new
// connections without a restart.
func TestTLSReload(t *testing.T) {
	pki := newPKI(t)
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, configJSON)
	addr, _ := startRun(t, io.Discard, "-config", cfg, "-redis", "127.0.0.1:1", "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0",
		"-tls-cert", pki.certFile, "-tls-key", pki.keyFile, "-watch-interval", "20ms")
	serial := func() string {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: x509.NewCertPool(), InsecureSkipVerify: true, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	if s := serial(); s != "2" {
		t.Fatalf("serial %s, want 2", s)
	}
	// A new key pair, serial 9, self-signed: the server presents whatever
	// the files hold (the client here checks no chain).
	dir := t.TempDir()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(k)
	certTmp, keyTmp := filepath.Join(dir, "c"), filepath.Join(dir, "k")
	_ = os.WriteFile(certTmp, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	_ = os.WriteFile(keyTmp, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600)
	if err := errors.Join(os.Rename(keyTmp, pki.keyFile), os.Rename(certTmp, pki.certFile)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new certificate served", func() bool { return serial() == "9" })
}
