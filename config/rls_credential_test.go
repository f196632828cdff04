package config_test

import (
	"strings"
	"testing"

	"github.com/tokengate/tokengate/config"
)

// TestRLSCredential: settings.rls.credential is read as given; anything but
// a string of 1 to 256 bytes is refused with its path, and the error never
// quotes the value (a secret).
func TestRLSCredential(t *testing.T) {
	doc := func(cred string) string {
		return `{"rules":[{"name":"a","scope":"cluster","algorithm_config":{"tokens_per_second":1,"burst":1}}],` +
			`"settings":{"rls":{"cluster":"rls","credential":` + cred + `}}}`
	}
	cfg, err := config.Parse([]byte(doc(`"proxy-secret-0123456789"`)))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Settings.RLS.Credential; got != "proxy-secret-0123456789" {
		t.Errorf("credential: got %q", got)
	}
	cfg, err = config.Parse([]byte(strings.Replace(doc(`""`), `,"credential":""`, "", 1)))
	if err != nil || cfg.Settings.RLS.Credential != "" {
		t.Errorf("no credential: %q %v", cfg.Settings.RLS.Credential, err)
	}
	for _, tc := range []struct{ name, cred string }{
		{"empty", `""`},
		{"a number", `12345678901234567890`},
		{"too long", `"` + strings.Repeat("s3cret", 50) + `"`},
	} {
		_, err := config.Parse([]byte(doc(tc.cred)))
		if err == nil || !strings.Contains(err.Error(), "settings.rls.credential: must be a string of 1 to 256 bytes") {
			t.Errorf("%s: got %v", tc.name, err)
		} else if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "1234567890") {
			t.Errorf("%s: the error quotes the secret: %v", tc.name, err)
		}
	}
}
