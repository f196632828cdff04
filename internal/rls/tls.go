package rls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
)

// TLSFiles name the PEM files of the gRPC listener's TLS.
type TLSFiles struct {
	// Cert and Key are the server's certificate chain and private key.
	Cert, Key string
	// ClientCA, when set, holds the certificates client certificates must
	// chain to; a client without such a certificate is refused in the
	// handshake. Empty: clients present none.
	ClientCA string
}

// ServerTLS is the gRPC listener's TLS configuration, read from its files
// and read again by Reload: connections made after a Reload use the new
// certificate and client CAs, those already open keep theirs.
type ServerTLS struct {
	files TLSFiles
	cur   atomic.Pointer[tls.Config]
}

// NewServerTLS reads the files.
func NewServerTLS(f TLSFiles) (*ServerTLS, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("tls: both a certificate and a key file are needed")
	}
	t := &ServerTLS{files: f}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload reads the files again and, when they make a valid
// configuration, uses it from the next handshake on; on error the
// previous one stays.
func (t *ServerTLS) Reload() error {
	cert, err := tls.LoadX509KeyPair(t.files.Cert, t.files.Key)
	if err != nil {
		return err
	}
	c := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// gRPC runs on HTTP/2 only; grpc-go clients refuse a server that
		// does not negotiate it.
		NextProtos: []string{"h2"},
	}
	if t.files.ClientCA != "" {
		pem, err := os.ReadFile(t.files.ClientCA)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return errors.New("tls: " + t.files.ClientCA + ": no PEM certificate")
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	t.cur.Store(c)
	return nil
}

// Files returns the files the configuration is read from.
func (t *ServerTLS) Files() TLSFiles { return t.files }

// Credentials returns the gRPC server's transport credentials: TLS with
// the configuration in use at each handshake. A failed handshake is
// counted in m (tokengate_rls_tls_handshake_errors_total) and logged
// through m's error log.
func (t *ServerTLS) Credentials(m *Metrics) credentials.TransportCredentials {
	base := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.cur.Load(), nil
		},
	}
	return countingCreds{credentials.NewTLS(base), m}
}

// countingCreds count and log failed server handshakes.
type countingCreds struct {
	credentials.TransportCredentials
	m *Metrics
}

func (c countingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	nc, ai, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil && c.m != nil {
		c.m.tlsErrors.Inc()
		if l := c.m.errLog.Load(); l != nil {
			l.Error("tls handshake failed", "tls", "peer", conn.RemoteAddr().String(), "error", err.Error())
		}
	}
	return nc, ai, err
}

func (c countingCreds) Clone() credentials.TransportCredentials {
	return countingCreds{c.TransportCredentials.Clone(), c.m}
}
