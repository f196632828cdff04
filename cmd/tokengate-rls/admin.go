package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// checkAdmin checks the admin API's flags (docs/rls.md#admin-api): they
// need the admin listener, a certificate name needs the client CA, and
// the proxies' certificates must not be admins by their name.
func (o *options) checkAdmin() error {
	if o.admin == "" && (o.adminCredFile != "" || o.usageCredFile != "" || o.tlsAdminURI != "") {
		return errors.New("-admin-credential-file, -usage-credential-file and -tls-admin-uri-prefix need the admin listener (-admin)")
	}
	if o.tlsAdminURI == "" {
		return nil
	}
	if o.tlsClientCA == "" {
		return errors.New("-tls-admin-uri-prefix needs -tls-client-ca (and -tls-cert, -tls-key)")
	}
	if o.tlsWriterURI != "" && strings.HasPrefix(o.tlsWriterURI, o.tlsAdminURI) {
		return fmt.Errorf("-tls-admin-uri-prefix %q covers -tls-writer-uri-prefix %q: every proxy would be an admin; give the admins a prefix of their own", o.tlsAdminURI, o.tlsWriterURI)
	}
	return nil
}

// adminSettings puts the admin API's rules into s: the admin's and the
// usage endpoint's credentials (read now; the daemon reads them again),
// and the admin certificate name. An admin credential that is also a
// proxy's is refused: the proxies' credential must not grant admin.
func (o *options) adminSettings(s *daemon.Settings) error {
	s.AdminAuth = rls.WriteAuth{Certs: o.tlsAdminURI != "", URIPrefix: o.tlsAdminURI}
	s.AdminCredentialFile, s.UsageCredentialFile = o.adminCredFile, o.usageCredFile
	if o.adminCredFile != "" {
		creds, err := rls.ReadCredentialFile(o.adminCredFile)
		if err != nil {
			return fmt.Errorf("-admin-credential-file: %w", err)
		}
		for i, c := range creds {
			if s.Writes.AcceptsCredential(c) {
				return fmt.Errorf("-admin-credential-file: credential %d is also a proxy's (-credential-file): the admin needs a credential of its own", i+1)
			}
		}
		s.AdminAuth = s.AdminAuth.WithCredentials(creds)
	}
	if o.usageCredFile != "" {
		creds, err := rls.ReadCredentialFile(o.usageCredFile)
		if err != nil {
			return fmt.Errorf("-usage-credential-file: %w", err)
		}
		s.UsageAuth = s.UsageAuth.WithCredentials(creds)
	}
	return nil
}

// adminAPIState says, for the start's log line, how the admin API
// authenticates: "off" (every call 403), else what admits its callers.
func (o *options) adminAPIState() string {
	var by []string
	if o.adminCredFile != "" {
		by = append(by, "credential")
	}
	if o.tlsAdminURI != "" {
		by = append(by, "certificate")
	}
	if o.usageCredFile != "" {
		by = append(by, "usage credential")
	}
	if len(by) == 0 {
		return "off"
	}
	return strings.Join(by, ", ")
}
