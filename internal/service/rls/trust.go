package rls

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// The trust model (docs/rls.md, "Trust model").
//
// A plain decision (ShouldRateLimit of descriptors to decide, an exact
// take from a lease bucket, the all-or-nothing refund of what that same
// call took) only takes what the bucket holds for the request at hand: the
// worst a caller can do is spend a key's tokens on its own requests, which
// is what the service is for. It stays open to whoever the network admits.
//
// A write moves tokens the call did not take itself: a settlement
// (charge, refund, reset after the response), a lease holder's grant,
// report or release. Writes are accepted only from an authenticated
// proxy: a call carrying one of the operator's credentials (the
// "authorization: Bearer <secret>" header, settings.rls.credential on the
// filter's side), or a call on a TLS connection whose client certificate
// chained to -tls-client-ca (and, with -tls-writer-uri-prefix, names a
// URI SAN under that prefix, e.g. a SPIFFE ID). Any other write is
// refused, UNAUTHENTICATED (no credential) or PERMISSION_DENIED (a wrong
// one), counted in tokengate_rls_writes_refused_total, and changes
// nothing.

// checkCredential reports whether s can be a credential: 16 to 256
// visible ASCII characters (it travels in a header; the filter's
// settings.rls.credential holds at most 256 bytes).
func checkCredential(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return len(s) >= 16 && len(s) <= 256
}

// CredentialHeader is the header (gRPC metadata) that carries a proxy's
// credential, as "Bearer <secret>".
const CredentialHeader = "authorization"

// WriteAuth says which calls may write. The zero value refuses every
// write; the daemon sets one from its settings (Server.SetWriteAuth).
type WriteAuth struct {
	// Open accepts every write, authenticated or not (the behaviour before
	// the trust model: -allow-unauthenticated-writes).
	Open bool
	// Certs accepts a write on a connection whose client certificate was
	// verified (-tls-client-ca), with a URI SAN starting with URIPrefix
	// when it is not empty.
	Certs     bool
	URIPrefix string
	// digests are the SHA-256 digests of the accepted credentials: they
	// are compared in constant time, and digests of equal length leak
	// nothing of a secret's length either.
	digests [][sha256.Size]byte
}

// AddCredential makes secret one of the accepted credentials.
func (a *WriteAuth) AddCredential(secret string) {
	a.digests = append(a.digests, sha256.Sum256([]byte(secret)))
}

// WithCredentials returns a copy of a that accepts secrets, and no
// other credential (a credential file read again).
func (a WriteAuth) WithCredentials(secrets []string) WriteAuth {
	a.digests = nil
	for _, c := range secrets {
		a.AddCredential(c)
	}
	return a
}

// AcceptsCredential reports whether secret is one of the accepted
// credentials (what a call carries after "Bearer ").
func (a *WriteAuth) AcceptsCredential(secret string) bool {
	return a.credentialOK([]string{"Bearer " + secret})
}

// Configured reports whether some authentication is configured.
func (a *WriteAuth) Configured() bool { return len(a.digests) > 0 || a.Certs }

// ReadCredentialFile reads the credentials of a file: one per line (more
// than one while a credential is rotated), blank lines and surrounding
// spaces ignored. A credential is 16 to 256 visible ASCII characters
// (checkCredential). Errors name the file and the line, never the
// secret.
func ReadCredentialFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseCredentials(path, b)
}

// ParseCredentials is ReadCredentialFile over the contents b of the file
// path.
func ParseCredentials(path string, b []byte) ([]string, error) {
	var out []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if !checkCredential(line) {
			return nil, errors.New(path + ": line " + strconv.Itoa(i+1) + ": a credential is 16 to 256 visible ASCII characters")
		}
		out = append(out, line)
	}
	if len(out) == 0 {
		return nil, errors.New(path + ": no credential")
	}
	return out, nil
}

// Reasons a write is refused (tokengate_rls_writes_refused_total's reason).
const (
	refusedNoCredential  = iota // no credential, no client certificate
	refusedBadCredential        // a credential, not one of the accepted
	refusedCertName             // a client certificate without the URI prefix
	numRefused
)

var refusedNames = [numRefused]string{"no_credential", "bad_credential", "cert_name"}

// SetWriteAuth makes a the rule for the writes of the calls that start
// from now on.
func (s *Server) SetWriteAuth(a WriteAuth) { s.auth.Store(&a) }

// authorizeWrite returns nil when the call may write, else the status to
// answer, counting the refusal.
func (s *Server) authorizeWrite(ctx context.Context) error {
	a := s.auth.Load()
	if a == nil {
		a = &WriteAuth{}
	}
	if a.Open {
		return nil
	}
	reason := refusedNoCredential
	if v := metadata.ValueFromIncomingContext(ctx, CredentialHeader); len(v) > 0 {
		if a.credentialOK(v) {
			return nil
		}
		reason = refusedBadCredential
	}
	if a.Certs {
		switch a.certOK(ctx) {
		case certAccepted:
			return nil
		case certWrongName:
			if reason == refusedNoCredential {
				reason = refusedCertName
			}
		}
	}
	s.metrics.writeRefused(reason)
	s.metrics.request(reqInvalid)
	if reason == refusedNoCredential {
		return status.Error(codes.Unauthenticated, "tokengate-rls: settlements and lease calls need a proxy's credential or client certificate (docs/rls.md#trust-model)")
	}
	return status.Error(codes.PermissionDenied, "tokengate-rls: this caller may not settle or lease (docs/rls.md#trust-model)")
}

// credentialOK reports whether one of the header's values is "Bearer "
// and an accepted credential, comparing every digest in constant time.
func (a *WriteAuth) credentialOK(values []string) bool {
	ok := 0
	for _, v := range values {
		tok, found := strings.CutPrefix(v, "Bearer ")
		if !found {
			continue
		}
		d := sha256.Sum256([]byte(tok))
		for i := range a.digests {
			ok |= subtle.ConstantTimeCompare(d[:], a.digests[i][:])
		}
	}
	return ok == 1
}

const (
	certNone = iota
	certAccepted
	certWrongName
)

// certOK says whether the call's connection has a verified client
// certificate, and whether it names a URI under URIPrefix.
func (a *WriteAuth) certOK(ctx context.Context) int {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return certNone
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return certNone
	}
	return verifiedCert(&ti.State, a.URIPrefix)
}

// trustMetrics are the trust model's counters.
type trustMetrics struct {
	refused [numRefused]prometheus.Counter
	clamped prometheus.Counter
}

func newTrustMetrics(register func(prometheus.Collector)) trustMetrics {
	var t trustMetrics
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tokengate_rls_writes_refused_total",
		Help: "Settlements and lease calls refused because the caller is not an authenticated proxy, by reason (docs/rls.md#trust-model)."}, []string{"reason"})
	register(vec)
	for i := range t.refused {
		t.refused[i] = vec.WithLabelValues(refusedNames[i])
	}
	t.clamped = prometheus.NewCounter(prometheus.CounterOpts{Name: "tokengate_rls_settle_clamped_total",
		Help: "Settlements cut: refunds larger than the rule's burst or than what the stream's receipt holds, charges larger than a hundred bursts, resets without a receipt (docs/rls.md#receipts)."})
	register(t.clamped)
	return t
}

func (m *Metrics) writeRefused(reason int) { m.trust.refused[reason].Inc() }
