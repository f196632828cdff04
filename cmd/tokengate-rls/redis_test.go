package main

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// storeFromFlags parses args as tokengate-rls's Redis flags and returns a
// store made from them (nil and the error when they are refused).
func storeFromFlags(t *testing.T, addr string, env map[string]string, args ...string) (*redisstore.Store, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var r redisSecurity
	r.flags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o := redisstore.Options{Addrs: []string{addr}, Timeout: time.Second}
	if err := r.apply(&o, func(k string) string { return env[k] }); err != nil {
		return nil, err
	}
	s, err := redisstore.New(o)
	if err != nil {
		return nil, err
	}
	t.Cleanup(s.Close)
	return s, nil
}

// decides reports whether the store decides a call within 3 s.
func decides(s *redisstore.Store) error {
	var err error
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		out := s.Run(context.Background(), []redisstore.Op{{Key: redisstore.BucketKey("flags", "a"), Rate: 1, Burst: 5, Cost: 1}})
		if err = out[0].Err; err == nil {
			return nil
		}
	}
	return err
}

// TestRedisTLSFlags: -redis-tls-ca, -redis-tls-cert/-key and
// -redis-tls-server-name reach a real redis-server on its tls-port that
// requires client certificates; without the client certificate, or with
// a server name the certificate does not hold, nothing is decided.
func TestRedisTLSFlags(t *testing.T) {
	_, addr, f := redistest.StartTLS(t, "--requirepass", "tls-pw")
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("tls-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	full := []string{"-redis-tls-ca", f.CA, "-redis-tls-cert", f.ClientCert, "-redis-tls-key", f.ClientKey,
		"-redis-tls-server-name", f.ServerName, "-redis-password-file", pwFile}
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
	}{
		{"ca-cert-name-password", full, true},
		{"no-password", full[:6], false}, // TLS to 127.0.0.1 (in the certificate), then NOAUTH
		{"no-client-cert", []string{"-redis-tls-ca", f.CA, "-redis-tls-server-name", f.ServerName, "-redis-password-file", pwFile}, false},
		{"wrong-server-name", append(append([]string{}, full...), "-redis-tls-server-name", "other.test"), false},
		{"plain-tcp", []string{"-redis-password-file", pwFile}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := storeFromFlags(t, addr, nil, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if err := decides(s); (err == nil) != tc.ok {
				t.Fatalf("%q: got %v, want success %v", tc.args, err, tc.ok)
			}
		})
	}
}

// TestRedisPasswordFromEnv: with no -redis-password-file the password
// comes from $TOKENGATE_RLS_REDIS_PASSWORD; the ACL user from -redis-user.
func TestRedisPasswordFromEnv(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "x", "--user", "svc", "on", ">env-pw", "~*", "+@all")
	s, err := storeFromFlags(t, srv.Addr, map[string]string{envRedisPassword: "env-pw"}, "-redis-user", "svc")
	if err != nil {
		t.Fatal(err)
	}
	if err := decides(s); err != nil {
		t.Fatal(err)
	}
	if _, err := storeFromFlags(t, srv.Addr, nil, "-redis-tls-cert", "c.pem"); err == nil {
		t.Error("-redis-tls-cert without -redis-tls-key: accepted")
	}
}
