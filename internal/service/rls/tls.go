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
	// ClientSAN, with ClientCA, is a name (DNS name, IP address) the
	// client certificate must carry besides chaining to ClientCA.
	ClientSAN string
	// ClientOptional, with ClientCA, lets clients without a certificate
	// connect (a certificate given is still verified): their plain
	// decisions are answered, their writes need a credential
	// (docs/rls.md#trust-model).
	ClientOptional bool
}

// ServerTLS is the gRPC listener's TLS configuration, read from its files
// and read again by Reload: connections made after a Reload use the new
// certificate and client CAs, those already open keep theirs.
type ServerTLS struct {
	files TLSFiles
	cur   atomic.Pointer[tls.Config]
	stamp []os.FileInfo // the files' state when last read (ReloadIfChanged)
}

// NewServerTLS reads the files.
func NewServerTLS(f TLSFiles) (*ServerTLS, error) {
	if f.Cert == "" || f.Key == "" {
		return nil, errors.New("tls: both a certificate and a key file are needed")
	}
	if f.ClientSAN != "" && f.ClientCA == "" {
		return nil, errors.New("tls: a client certificate name needs a client CA file")
	}
	t := &ServerTLS{files: f}
	t.stamp, _ = t.fileStamp()
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
		optional := t.files.ClientOptional
		if optional {
			c.ClientAuth = tls.VerifyClientCertIfGiven
		}
		if san := t.files.ClientSAN; san != "" {
			c.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
				if optional && len(raw) == 0 {
					return nil // no certificate: a client that may not write
				}
				for _, ch := range chains {
					if len(ch) > 0 && ch[0].VerifyHostname(san) == nil {
						return nil
					}
				}
				return errors.New("tls: the client certificate does not carry the name " + san)
			}
		}
	}
	t.cur.Store(c)
	return nil
}

// ReloadIfChanged reloads the files when one of them looks different
// from when they were last read (another file behind the name, as when
// a Kubernetes Secret volume swaps its symbolic link, another size or
// modification time). It reports whether it reloaded; on error (a file
// missing or bad mid-rotation) the configuration in use stays and the
// next call tries again. One goroutine at a time may call it.
func (t *ServerTLS) ReloadIfChanged() (bool, error) {
	stamp, err := t.fileStamp()
	if err != nil {
		return false, err
	}
	if sameFiles(stamp, t.stamp) {
		return false, nil
	}
	if err := t.Reload(); err != nil {
		return false, err
	}
	t.stamp = stamp
	return true, nil
}

// fileStamp is the files' state: which file, its size and its time.
func (t *ServerTLS) fileStamp() ([]os.FileInfo, error) {
	var out []os.FileInfo
	for _, p := range []string{t.files.Cert, t.files.Key, t.files.ClientCA} {
		if p == "" {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	return out, nil
}

// sameFiles reports whether two stamps describe the same files unchanged.
func sameFiles(a, b []os.FileInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if FileChanged(a[i], b[i]) {
			return false
		}
	}
	return true
}

// FileChanged reports whether a file looks different from before (nil:
// missing): another file behind the name (a ConfigMap's or Secret's new
// symbolic link target), another size or modification time.
func FileChanged(a, b os.FileInfo) bool {
	if a == nil || b == nil {
		return a != b
	}
	return !os.SameFile(a, b) || a.Size() != b.Size() || !a.ModTime().Equal(b.ModTime())
}

// Credentials returns the gRPC server's transport credentials: TLS with
// the configuration in use at each handshake. A failed handshake is
// counted in m (tokengate_rls_tls_handshake_errors_total) and logged
// through m's error log.
func (t *ServerTLS) Credentials(m *Metrics) credentials.TransportCredentials {
	return countingCreds{credentials.NewTLS(t.Config()), m}
}

// Config returns a TLS configuration that, at each handshake, uses the
// configuration in use then (GetConfigForClient).
func (t *ServerTLS) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.cur.Load(), nil
		},
	}
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
