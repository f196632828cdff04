package rls

import "crypto/tls"

// HTTPConfig returns a TLS configuration for an HTTP listener (the admin
// listener, with -tls-admin-uri-prefix) from the same files as the gRPC
// listener's, in use at each handshake: HTTP/1.1 (the admin's calls are
// few), and a client certificate verified when given but never required,
// so that probes and scrapers without one still reach /ready and /metrics
// while the admin API accepts only certificates under its prefix
// (AdminGate).
func (t *ServerTLS) HTTPConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := t.cur.Load().Clone()
			c.NextProtos = []string{"http/1.1"}
			if c.ClientCAs != nil {
				c.ClientAuth = tls.VerifyClientCertIfGiven
			}
			return c, nil
		},
	}
}
