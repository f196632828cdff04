package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// adminRuleConfig has one token-bucket rule keyed by API key.
const adminRuleConfig = `{"rules":[{"name":"per-key","scope":"cluster","limit_keys":["header:x-api-key"],
  "algorithm_config":{"tokens_per_second":1,"burst":10}}],
 "settings":{"rls":{"cluster":"ratelimit"}}}`

// adminPut sends PUT /v1/overrides/per-key?key=key {"rate": 2} with the
// bearer credential cred ("": none) through client and returns the status.
func adminPut(t *testing.T, client *http.Client, base, cred, key string) int {
	t.Helper()
	req, err := http.NewRequest("PUT", base+"/v1/overrides/per-key?key="+key, strings.NewReader(`{"rate": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	if cred != "" {
		req.Header.Set("authorization", "Bearer "+cred)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestAdminFlags: the admin flags are refused at start when they cannot
// work or would let the proxies administer: a certificate name without a
// client CA, an admin prefix that covers the proxies' prefix, an admin
// credential that is also a proxy's, admin flags without the admin
// listener; a bad credential file is named without its content.
func TestAdminFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rls.json")
	writeFile(t, cfg, adminRuleConfig)
	proxies := filepath.Join(dir, "proxies")
	writeFile(t, proxies, "a-credential-of-twenty-four\n")
	shared := filepath.Join(dir, "shared")
	writeFile(t, shared, "an-admin-credential-01234\na-credential-of-twenty-four\n")
	bad := filepath.Join(dir, "bad")
	writeFile(t, bad, "short-secret\n")
	pki := newWriterPKI(t)
	tlsArgs := []string{"-tls-cert", pki.certFile, "-tls-key", pki.keyFile, "-tls-client-ca", pki.caFile}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-tls-admin-uri-prefix", "spiffe://x/ops/"}, "-tls-admin-uri-prefix needs -tls-client-ca"},
		{append([]string{"-tls-admin-uri-prefix", "spiffe://x/", "-tls-writer-uri-prefix", "spiffe://x/edge/"}, tlsArgs...), "every proxy would be an admin"},
		{[]string{"-credential-file", proxies, "-admin-credential-file", shared}, "credential 2 is also a proxy's"},
		{[]string{"-admin", "", "-admin-credential-file", proxies}, "need the admin listener"},
		{[]string{"-admin-credential-file", bad}, "-admin-credential-file: " + bad + ": line 1"},
		{[]string{"-usage-credential-file", filepath.Join(dir, "missing")}, "-usage-credential-file: open"},
	} {
		err := run(context.Background(), append([]string{"-config", cfg, "-redis", "127.0.0.1:1"}, tc.args...), io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "short-secret") {
			t.Errorf("%q: got %v, want an error with %q (and no secret)", tc.args, err, tc.want)
		}
	}
	// Every admin flag is also an environment variable.
	t.Setenv("TOKENGATE_RLS_ADMIN_CREDENTIAL_FILE", bad)
	err := run(context.Background(), []string{"-config", cfg, "-redis", "127.0.0.1:1"}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "-admin-credential-file: "+bad) {
		t.Errorf("TOKENGATE_RLS_ADMIN_CREDENTIAL_FILE: got %v, want the file read as -admin-credential-file", err)
	}
}

// TestAdminCredentialReload runs the program with -admin-credential-file
// and rotates the file: a change is put in force by the poll (-watch-
// interval), both credentials while the file holds both, the new one alone
// after; then, with polling off, a SIGHUP reads the file again. A
// credential no longer in the file is refused, 403.
func TestAdminCredentialReload(t *testing.T) {
	const oldCred, newCred, thirdCred = "old-admin-credential-0123", "new-admin-credential-0123", "third-admin-credential-01"
	redis := redistest.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rls.json")
	writeFile(t, cfg, adminRuleConfig)
	creds := filepath.Join(dir, "admin")
	writeFile(t, creds, oldCred+"\n")
	p := startProc(t, "-config", cfg, "-redis", redis.Addr, "-redis-timeout", "5s", "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0",
		"-admin-credential-file", creds, "-watch-interval", "50ms")
	c := http.DefaultClient
	if got := p.waitLog("serving", 1)["admin_api"]; got != "credential" {
		t.Errorf("serving line: admin_api %v, want credential", got)
	}
	waitReady(t, p.admin)
	if st := adminPut(t, c, p.admin, oldCred, "a"); st != 200 {
		t.Fatalf("the first credential: %d, want 200", st)
	}
	writeFile(t, creds, oldCred+"\n"+newCred+"\n")
	p.waitLog("credentials reloaded", 1)
	for _, cred := range []string{oldCred, newCred} {
		if st := adminPut(t, c, p.admin, cred, "a"); st != 200 {
			t.Errorf("during the rotation, %s: %d, want 200", cred, st)
		}
	}
	writeFile(t, creds, newCred+"\n")
	p.waitLog("credentials reloaded", 2)
	if st := adminPut(t, c, p.admin, oldCred, "b"); st != 403 {
		t.Errorf("the old credential after the rotation: %d, want 403", st)
	}
	if st := adminPut(t, c, p.admin, newCred, "b"); st != 200 {
		t.Errorf("the new credential after the rotation: %d, want 200", st)
	}
	if ok := redis.MustDo("EXISTS", "ov:{per-key:b}").(int64); ok != 1 {
		t.Errorf("ov:{per-key:b} not written by the accepted call")
	}

	// SIGHUP, polling off.
	q := startProc(t, "-config", cfg, "-redis", redis.Addr, "-redis-timeout", "5s", "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0",
		"-admin-credential-file", creds, "-watch-interval", "0")
	waitReady(t, q.admin)
	writeFile(t, creds, thirdCred+"\n")
	if err := q.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	q.waitLog("credentials reloaded", 1)
	if st := adminPut(t, c, q.admin, newCred, "c"); st != 403 {
		t.Errorf("after SIGHUP, the replaced credential: %d, want 403", st)
	}
	if st := adminPut(t, c, q.admin, thirdCred, "c"); st != 200 {
		t.Errorf("after SIGHUP, the new credential: %d, want 200", st)
	}
}

// waitReady waits for the admin listener at base to answer /ready 200.
func waitReady(t *testing.T, base string) {
	t.Helper()
	waitFor(t, base+"/ready", func() bool {
		resp, err := http.Get(base + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// TestAdminCertificates: with -tls-admin-uri-prefix the admin listener
// serves TLS; a client certificate of the CA naming a URI under the admin
// prefix may call the admin API, a proxy's certificate (under the
// writers' prefix) may not, 403, and a caller without a certificate is
// asked for a credential, 401; /ready still answers a caller without
// one.
func TestAdminCertificates(t *testing.T) {
	pki := newWriterPKI(t)
	redis := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, adminRuleConfig)
	_, admin := startRun(t, io.Discard, "-config", cfg, "-redis", redis.Addr, "-redis-timeout", "5s", "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0",
		"-tls-cert", pki.certFile, "-tls-key", pki.keyFile, "-tls-client-ca", pki.caFile, "-tls-client-optional",
		"-tls-writer-uri-prefix", "spiffe://cluster.local/ns/edge/", "-tls-admin-uri-prefix", "spiffe://cluster.local/ns/ops/")
	admin = "https://" + strings.TrimPrefix(admin, "http://")
	client := func(c *tls.Config) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: c}, Timeout: 10 * time.Second}
	}
	anon := client(pki.client(t, true))
	waitFor(t, "/ready over TLS without a certificate", func() bool {
		resp, err := anon.Get(admin + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	for _, tc := range []struct {
		name string
		c    *http.Client
		want int
	}{
		{"no certificate", anon, 401},
		{"a proxy's certificate", client(pki.client(t, false, "spiffe://cluster.local/ns/edge/sa/envoy")), 403},
		{"no URI", client(pki.client(t, false)), 403},
	} {
		if st := adminPut(t, tc.c, admin, "", "k"); st != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, st, tc.want)
		}
		if n := redis.MustDo("EXISTS", "ov:{per-key:k}").(int64); n != 0 {
			t.Fatalf("%s: a refused call wrote the override", tc.name)
		}
	}
	if st := adminPut(t, client(pki.client(t, false, "spiffe://cluster.local/ns/ops/sa/portal")), admin, "", "k"); st != 200 {
		t.Errorf("an admin's certificate: %d, want 200", st)
	}
	if n := redis.MustDo("EXISTS", "ov:{per-key:k}").(int64); n != 1 {
		t.Errorf("the admin's call did not write the override")
	}
}
