package rls

import (
	"crypto/tls"
	"net/http"
	"strings"
	"sync/atomic"
)

// Who may call the admin API and the usage endpoint (docs/rls.md, "Trust
// model").
//
// The admin API changes what every replica decides (a key's limit), so it
// is never open: without an admin credential (-admin-credential-file) or
// an admin certificate name (-tls-admin-uri-prefix) every call is
// refused, 403, naming the flags. The proxies' credentials and
// certificates authenticate writes of tokens (WriteAuth), not the admin:
// the two are configured apart and checked apart. The usage endpoint only
// reads; it may be given a credential of its own (-usage-credential-file,
// a customer portal's backend) and the admin's credentials read it too.

// Access levels of an admin call.
const (
	accessNone  = iota
	accessUsage // GET /v1/usage
	accessAdmin // everything under /v1/
)

// AdminGate holds who may call the admin API and the usage endpoint, each
// a WriteAuth of its own (its Open field is never honoured: the admin is
// never open), replaced while serving when a credential file is read
// again. It is safe for concurrent use.
type AdminGate struct {
	admin, usage atomic.Pointer[WriteAuth]
}

// NewAdminGate returns a gate admitting admin to everything and usage to
// the usage endpoint.
func NewAdminGate(admin, usage WriteAuth) *AdminGate {
	g := &AdminGate{}
	g.SetAdmin(admin)
	g.SetUsage(usage)
	return g
}

// SetAdmin makes a the admin's rule for the calls from now on.
func (g *AdminGate) SetAdmin(a WriteAuth) { a.Open = false; g.admin.Store(&a) }

// SetUsage makes a the usage endpoint's own rule for the calls from now on.
func (g *AdminGate) SetUsage(a WriteAuth) { a.Open = false; g.usage.Store(&a) }

// refusal is an admin call's refusal: its status, its outcome label and
// its message.
type refusal struct {
	status  int
	outcome int
	msg     string
}

// authorize returns nil when r may have access need, else why not.
func (g *AdminGate) authorize(r *http.Request, need int) *refusal {
	admin, usage := g.admin.Load(), g.usage.Load()
	configured := admin.Configured() || need == accessUsage && usage.Configured()
	if !configured {
		msg := "the admin API is off: start tokengate-rls with -admin-credential-file (or -tls-client-ca with -tls-admin-uri-prefix) to enable it (docs/rls.md#admin-api)"
		if need == accessUsage {
			msg = "the usage endpoint is off: start tokengate-rls with -usage-credential-file or -admin-credential-file (or -tls-client-ca with -tls-admin-uri-prefix) to enable it (docs/rls.md#usage-endpoint)"
		}
		return &refusal{http.StatusForbidden, adminDisabled, msg}
	}
	if v := r.Header.Values("Authorization"); len(v) > 0 {
		switch {
		case admin.credentialOK(v):
			return nil
		case need == accessUsage && usage.credentialOK(v):
			return nil
		case need == accessAdmin && usage.credentialOK(v):
			return &refusal{http.StatusForbidden, adminForbidden, "this credential may only read usage (GET /v1/usage/...)"}
		}
		return &refusal{http.StatusForbidden, adminForbidden, "the credential is not an admin credential (docs/rls.md#admin-api)"}
	}
	if admin.Certs && admin.URIPrefix != "" {
		switch verifiedCert(r.TLS, admin.URIPrefix) {
		case certAccepted:
			return nil
		case certWrongName:
			return &refusal{http.StatusForbidden, adminForbidden, "the client certificate has no URI SAN under the admin prefix (-tls-admin-uri-prefix)"}
		}
	}
	return &refusal{http.StatusUnauthorized, adminUnauthenticated, `missing "authorization: Bearer <credential>" (docs/rls.md#admin-api)`}
}

// verifiedCert says whether st (nil: no TLS) has a verified client
// certificate, and whether it names a URI under prefix ("": any).
func verifiedCert(st *tls.ConnectionState, prefix string) int {
	if st == nil || len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return certNone
	}
	if prefix == "" {
		return certAccepted
	}
	for _, u := range st.VerifiedChains[0][0].URIs {
		if strings.HasPrefix(u.String(), prefix) {
			return certAccepted
		}
	}
	return certWrongName
}
