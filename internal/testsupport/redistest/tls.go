package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TLSFiles are the PEM files of a TLS server (StartTLS), made for the
// test: a CA, the server's certificate (for 127.0.0.1 and ServerName)
// and a client certificate the server accepts.
type TLSFiles struct {
	CA, ClientCert, ClientKey string
	// ServerName is the DNS name in the server's certificate.
	ServerName string
}

// StartTLS starts a redis-server that also listens with TLS on TLSAddr,
// requiring client certificates signed by the test's CA (tls-auth-clients
// yes); Addr stays plain TCP for the test's own Do.
func StartTLS(t testing.TB, extra ...string) (*Server, string, TLSFiles) {
	t.Helper()
	dir := t.TempDir()
	files := TLSFiles{ServerName: "redis.test"}
	caKey, caCert, caDER := newCert(t, "tokengate test CA", nil, nil, true, nil)
	files.CA = writePEM(t, dir, "ca.pem", "CERTIFICATE", caDER)
	srvKey, _, srvDER := newCert(t, "redis", caCert, caKey, false, []string{files.ServerName})
	srvCert := writePEM(t, dir, "server.pem", "CERTIFICATE", srvDER)
	srvKeyFile := writeKey(t, dir, "server-key.pem", srvKey)
	cliKey, _, cliDER := newCert(t, "tokengate-rls", caCert, caKey, false, nil)
	files.ClientCert = writePEM(t, dir, "client.pem", "CERTIFICATE", cliDER)
	files.ClientKey = writeKey(t, dir, "client-key.pem", cliKey)
	port := freePort(t)
	args := append([]string{
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", srvCert,
		"--tls-key-file", srvKeyFile,
		"--tls-ca-cert-file", files.CA,
		"--tls-auth-clients", "yes",
	}, extra...)
	return Start(t, args...), "127.0.0.1:" + strconv.Itoa(port), files
}

func newCert(t testing.TB, cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, ca bool, dns []string) (*ecdsa.PrivateKey, *x509.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     dns,
	}
	if dns != nil {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	if ca {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert, der
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func writeKey(t testing.TB, dir, name string, key *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, dir, name, "EC PRIVATE KEY", der)
}
