package rls_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/redistest"
	"github.com/tokengate/tokengate/internal/rls"
)

// TestStoreAuth: the store authenticates with requirepass's password and
// with an ACL user; without them, or with a wrong one, it never decides.
func TestStoreAuth(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "s3cret", "--user", "svc", "on", ">svc-pw", "~tb:*", "+@all")
	op := []rls.Op{{Key: rls.BucketKey("auth", "a"), Rate: 1, Burst: 5, Cost: 1}}
	for _, tc := range []struct {
		name, user, password string
		ok                   bool
	}{
		{"requirepass", "", "s3cret", true},
		{"acl-user", "svc", "svc-pw", true},
		{"no-password", "", "", false},
		{"wrong-password", "svc", "nope", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := rls.NewStore(rls.StoreOptions{Addrs: []string{srv.Addr}, Timeout: time.Second,
				Username: tc.user, Password: tc.password})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var last error
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				out := s.Run(context.Background(), op)
				if last = out[0].Err; last == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if (last == nil) != tc.ok {
				t.Fatalf("user %q password %q: got error %v, want success %v", tc.user, tc.password, last, tc.ok)
			}
		})
	}
}
