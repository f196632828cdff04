package daemon

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/service/rls"
)

// TestCredentialsReload steps the proxies' credential file through a
// rotation: a poll puts a changed file in force (the old credential and
// the new one during the rotation, then the new one alone); a poll of an
// unchanged file does nothing; a bad file keeps the credentials in force
// and is logged once, without the secret; a SIGHUP reads the file even
// when it did not change. The rule's other fields (Certs, the URI prefix)
// stay what they were.
func TestCredentialsReload(t *testing.T) {
	const oldCred, newCred = "old-credential-0123456789", "new-credential-0123456789"
	path := filepath.Join(t.TempDir(), "credentials")
	write := func(data string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(oldCred + "\n")
	base := rls.WriteAuth{Certs: true, URIPrefix: "spiffe://mesh/"}
	base.AddCredential(oldCred)
	var inForce *rls.WriteAuth
	sets := 0
	c := newCredentials(path, base, func(a rls.WriteAuth) { inForce, sets = &a, sets+1 })
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	steps := []struct {
		name     string
		write    string // "" leaves the file as it is
		force    bool   // SIGHUP rather than a poll
		wantSets int
		accept   []string
		refuse   []string
	}{
		{"unchanged file, polled", "", false, 0, nil, nil},
		{"rotation: both", oldCred + "\n" + newCred + "\n", false, 1, []string{oldCred, newCred}, nil},
		{"rotation done", newCred + "\n", false, 2, []string{newCred}, []string{oldCred}},
		{"unchanged again", "", false, 2, []string{newCred}, []string{oldCred}},
		{"bad file: the ones in force stay", "short\n", false, 2, []string{newCred}, []string{oldCred}},
		{"the same bad file, polled again", "", false, 2, []string{newCred}, []string{oldCred}},
		{"fixed, then SIGHUP", oldCred + "\n", true, 3, []string{oldCred}, []string{newCred}},
		{"SIGHUP of an unchanged file reads it", "", true, 4, []string{oldCred}, []string{newCred}},
	}
	for i, st := range steps {
		if st.write != "" {
			write(st.write)
		}
		c.reload(log, "test", st.force)
		if sets != st.wantSets {
			t.Fatalf("step %d (%s): %d rules put in force, want %d", i, st.name, sets, st.wantSets)
		}
		if inForce == nil {
			continue
		}
		for _, s := range st.accept {
			if !inForce.AcceptsCredential(s) {
				t.Errorf("step %d (%s): %q refused, want accepted", i, st.name, s)
			}
		}
		for _, s := range st.refuse {
			if inForce.AcceptsCredential(s) {
				t.Errorf("step %d (%s): %q accepted, want refused", i, st.name, s)
			}
		}
		if !inForce.Certs || inForce.URIPrefix != "spiffe://mesh/" {
			t.Errorf("step %d (%s): the rule's other fields changed: %+v", i, st.name, *inForce)
		}
	}
	if n := strings.Count(logs.String(), "credentials not reloaded"); n != 1 {
		t.Errorf("the bad file was logged %d times, want once:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), oldCred) || strings.Contains(logs.String(), newCred) {
		t.Errorf("a credential is in the log:\n%s", logs.String())
	}
}
