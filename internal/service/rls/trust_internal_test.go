package rls

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestAuthorizeWrite: who may write, by the service's settings and the
// call's authorization header; every refusal is counted once by reason.
func TestAuthorizeWrite(t *testing.T) {
	const a, b = "credential-a-0123456789", "credential-b-0123456789"
	both := WriteAuth{}
	both.AddCredential(a)
	both.AddCredential(b)
	for _, tc := range []struct {
		name   string
		auth   *WriteAuth // nil: never set
		header []string
		want   codes.Code
		reason int
	}{
		{"never set: refused", nil, nil, codes.Unauthenticated, refusedNoCredential},
		{"zero value: refused even with a header", &WriteAuth{}, []string{"Bearer " + a}, codes.PermissionDenied, refusedBadCredential},
		{"open", &WriteAuth{Open: true}, nil, codes.OK, -1},
		{"first credential", &both, []string{"Bearer " + a}, codes.OK, -1},
		{"second credential (rotation)", &both, []string{"Bearer " + b}, codes.OK, -1},
		{"one good value among several", &both, []string{"Bearer nope", "Bearer " + b}, codes.OK, -1},
		{"no header", &both, nil, codes.Unauthenticated, refusedNoCredential},
		{"no Bearer", &both, []string{a}, codes.PermissionDenied, refusedBadCredential},
		{"lower-case bearer", &both, []string{"bearer " + a}, codes.PermissionDenied, refusedBadCredential},
		{"a prefix of it", &both, []string{"Bearer " + a[:len(a)-1]}, codes.PermissionDenied, refusedBadCredential},
		{"longer", &both, []string{"Bearer " + a + "x"}, codes.PermissionDenied, refusedBadCredential},
		{"certificates but none on the call", &WriteAuth{Certs: true}, nil, codes.Unauthenticated, refusedNoCredential},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(`{"rules":[{"name":"r","scope":"cluster","algorithm_config":{"tokens_per_second":1,"burst":1}}],"settings":{"rls":{"cluster":"c"}}}`))
			if err != nil {
				t.Fatal(err)
			}
			s := NewServer(cfg, nil, NewMetrics(cfg))
			if tc.auth != nil {
				s.SetWriteAuth(*tc.auth)
			}
			ctx := context.Background()
			if tc.header != nil {
				ctx = metadata.NewIncomingContext(ctx, metadata.MD{CredentialHeader: tc.header})
			}
			if got := status.Code(s.authorizeWrite(ctx)); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for r := range numRefused {
				want := 0.0
				if r == tc.reason {
					want = 1
				}
				if got := refusedCount(t, s.metrics, refusedNames[r]); got != want {
					t.Errorf("refused{%s}: got %v, want %v", refusedNames[r], got, want)
				}
			}
		})
	}
}

// TestReadCredentialFile: one credential per line, blank lines and spaces
// ignored; a bad line is named by number, never shown.
func TestReadCredentialFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		want          []string
		err           string
	}{
		{"one", "credential-a-0123456789\n", []string{"credential-a-0123456789"}, ""},
		{"two, spaces, CRLF", "  credential-a-0123456789 \r\n\r\ncredential-b-0123456789", []string{"credential-a-0123456789", "credential-b-0123456789"}, ""},
		{"empty", "\n\n", nil, "no credential"},
		{"short", "credential-a-0123456789\nsecret-short\n", nil, "line 2: a credential is 16 to 256"},
		{"inner space", "credential a 0123456789\n", nil, "line 1:"},
		{"too long", strings.Repeat("s", 257), nil, "line 1:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := ReadCredentialFile(p)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "secret-short") || strings.Contains(err.Error(), "credential a") {
					t.Fatalf("got %v, want an error with %q and no secret", err, tc.err)
				}
				return
			}
			if err != nil || strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("got %q %v, want %q", got, err, tc.want)
			}
		})
	}
}

// refusedCount reads tokengate_rls_writes_refused_total{reason} from m's
// registry.
func refusedCount(t *testing.T, m *Metrics, reason string) float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "tokengate_rls_writes_refused_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return s.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no tokengate_rls_writes_refused_total{reason=%q}", reason)
	return 0
}
