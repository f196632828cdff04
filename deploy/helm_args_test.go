package deploy

import (
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	rlsBinOnce sync.Once
	rlsBin     string
	rlsBinErr  error
)

// builtRLS builds cmd/tokengate-rls once per test process.
func builtRLS(t *testing.T) string {
	t.Helper()
	rlsBinOnce.Do(func() {
		dir, err := filepath.Abs(filepath.Join("..", "build", "deploy-test"))
		if err != nil {
			rlsBinErr = err
			return
		}
		rlsBin = filepath.Join(dir, "tokengate-rls")
		cmd := exec.Command("go", "build", "-o", rlsBin, "./cmd/tokengate-rls")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			rlsBinErr = err
			t.Logf("%s", out)
		}
	})
	if rlsBinErr != nil {
		t.Fatalf("building cmd/tokengate-rls: %v", rlsBinErr)
	}
	return rlsBin
}

// TestChartArgsParse: every command line the chart renders is one the
// service's own flag set accepts — the chart's tests check the arguments
// they expect, this checks that the program knows them all. The program
// parses the whole line and stops at the -help put last (exit 0 or 2),
// so a flag it does not define or a value it refuses is reported.
func TestChartArgsParse(t *testing.T) {
	bin := builtRLS(t)
	for name, vals := range map[string]string{
		"defaults": ``,
		"external cluster with AUTH and TLS": `
redis:
  timeout: 40ms
  internal: {enabled: false}
  external:
    addresses: [redis-0.redis:6379, redis-1.redis:6379]
    cluster: true
    username: tokengate
    passwordSecret: {name: redis-auth, key: pass}
    tls:
      enabled: true
      serverName: redis.example.internal
      caSecret: {name: redis-ca}
      clientCertSecret: redis-client
`,
		"sentinel": `
redis:
  internal: {enabled: false}
  external:
    addresses: [sentinel-0:26379, sentinel-1:26379]
    sentinel:
      master: mymaster
      passwordSecret: {name: sentinel-auth}
`,
		"server TLS": `
tls: {enabled: true, secretName: rls-tls, clientCASecret: rls-clients}
`,
		"limits": `
limits: {maxDescriptors: 16, maxEntries: 8, maxEntryBytes: 512, maxMessageBytes: 65536,
  maxStreamsPerConnection: 100, maxInflightDescriptors: 1000, maxRLQSBuckets: 5000}
`,
	} {
		t.Run(name, func(t *testing.T) {
			_, c := rlsContainer(t, mustRender(t, vals))
			if len(c.Command) > 0 && !strings.HasSuffix(c.Command[0], "tokengate-rls") {
				t.Fatalf("command %q is not tokengate-rls", c.Command)
			}
			out, err := exec.Command(bin, append(append([]string{}, c.Args...), "-help")...).CombinedOutput()
			text := string(out)
			for _, bad := range []string{"flag provided but not defined", "invalid value", "invalid boolean", "unexpected arguments"} {
				if strings.Contains(text, bad) {
					t.Fatalf("args %q: %s", c.Args, text)
				}
			}
			if !strings.Contains(text, "-redis-timeout") {
				t.Fatalf("args %q: no usage printed (%v): %s", c.Args, err, text)
			}
		})
	}
}
