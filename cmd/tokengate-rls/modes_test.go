package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/internal/testsupport/testport"
	"github.com/tokengate/tokengate/rlscontract"
)

// The service's two entry points share one lifecycle (daemon.Run): every
// test here runs each operational behaviour in both modes, tokengate-rls
// (flags and a JSON file) and the drop-in (started as ratelimit, its
// environment and runtime directory).

// service is one running mode.
type service struct {
	grpc string
	// ready answers 200 while the service is ready, 5xx otherwise (the
	// admin /ready; the drop-in's /healthcheck).
	ready string
	// metrics is the Prometheus endpoint.
	metrics string
	// call is a call that takes from a bucket in Redis.
	call *rlsv3.RateLimitRequest
	// stop ends the run (SIGTERM); done receives its result.
	stop func()
	done chan error
}

// modeOptions are what a test asks of a mode.
type modeOptions struct {
	redis string
	// cert and key, when not empty, serve gRPC over TLS from these files.
	cert, key string
	logw      io.Writer
}

// mode starts the service one way.
type mode struct {
	name  string
	start func(t *testing.T, o modeOptions) *service
}

var modes = []mode{
	{"tokengate-rls", startRLSMode},
	{"drop-in", startDropinMode},
}

// startRLSMode runs tokengate-rls with a cluster rule "api", a long Redis
// timeout (a call waits for a frozen Redis) and no drain delay.
func startRLSMode(t *testing.T, o modeOptions) *service {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, rlqsConfig)
	args := []string{"-config", cfg, "-redis", o.redis, "-redis-timeout", "5s", "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0",
		"-drain-delay", "0", "-drain", "20s", "-watch-interval", "50ms"}
	if o.cert != "" {
		args = append(args, "-tls-cert", o.cert, "-tls-key", o.key)
	}
	s := &service{call: &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*commonrl.RateLimitDescriptor{
		descriptorOf(rlscontract.ClusterDescriptor("api", "acme", 0))}}}
	run := func(ctx context.Context, listening chan<- [2]string) error { return run(ctx, args, o.logw, listening) }
	addrs := s.begin(t, run)
	s.grpc, s.ready, s.metrics = addrs[0], "http://"+addrs[1]+"/ready", "http://"+addrs[1]+"/metrics"
	return s
}

// startDropinMode runs the drop-in with a domain "a" and the same
// Redis timeout and drain as startRLSMode.
func startDropinMode(t *testing.T, o modeOptions) *service {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "rl", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n")
	debug := "127.0.0.1:" + strconv.Itoa(testport.Free(t))
	env := []string{"HOST", "127.0.0.1", "PORT", "0", "GRPC_HOST", "127.0.0.1", "GRPC_PORT", "0",
		"DEBUG_HOST", "127.0.0.1", "DEBUG_PORT", debug[strings.LastIndex(debug, ":")+1:], "USE_STATSD", "false",
		"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", o.redis, "REDIS_TIMEOUT", "5s", "RUNTIME_ROOT", root, "RUNTIME_SUBDIRECTORY", "rl",
		"TOKENGATE_RLS_DRAIN", "20s", "LOG_LEVEL", "info"}
	if o.cert != "" {
		env = append(env, "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", o.cert, "GRPC_SERVER_TLS_KEY", o.key)
	}
	s := &service{call: &rlsv3.RateLimitRequest{Domain: "a", Descriptors: []*commonrl.RateLimitDescriptor{
		{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}}
	run := func(ctx context.Context, listening chan<- [2]string) error {
		return runRatelimit(ctx, envOf(env...), o.logw, listening)
	}
	addrs := s.begin(t, run)
	s.grpc, s.ready, s.metrics = addrs[0], "http://"+addrs[1]+"/healthcheck", "http://"+debug+"/metrics"
	return s
}

// descriptorOf is a contract descriptor as the protocol's message.
func descriptorOf(d rlscontract.Descriptor) *commonrl.RateLimitDescriptor {
	m := &commonrl.RateLimitDescriptor{}
	for _, e := range d.Entries {
		m.Entries = append(m.Entries, &commonrl.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
	}
	return m
}

// begin runs run until the test ends (or stop) and returns the addresses
// it listens on.
func (s *service) begin(t *testing.T, run func(context.Context, chan<- [2]string) error) [2]string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan [2]string, 1)
	s.done = make(chan error, 1)
	s.stop = cancel
	go func() { s.done <- run(ctx, listening) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Error("the service did not stop within 30 s")
		}
	})
	select {
	case a := <-listening:
		return a
	case err := <-s.done:
		s.done <- err
		t.Fatalf("start: %v", err)
	}
	return [2]string{}
}

// conn is a plaintext client of the service's gRPC listener.
func (s *service) conn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestModesHealthRLQS: in both modes the gRPC health service and the
// HTTP readiness follow Redis, RLS v3 decides, and RLQS is served.
func TestModesHealthRLQS(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			redis := redistest.Start(t)
			s := m.start(t, modeOptions{redis: redis.Addr, logw: io.Discard})
			conn := s.conn(t)
			waitFor(t, "ready", func() bool { code, _ := get(t, s.ready); return code == http.StatusOK })
			if st, err := healthCheck(t, conn, ""); err != nil || st != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("gRPC health with Redis up: %v %v, want SERVING", st, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, s.call); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Errorf("a call: %v %v, want OK", r, err)
			}
			stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
			if err != nil {
				t.Fatal(err)
			}
			free := &rlqsv3.BucketId{Bucket: map[string]string{rlscontract.RuleKey: "no-such-rule"}}
			if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "tokengate", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: free}}}); err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("RLQS: %v, want an answer", err)
			}
			if len(resp.GetBucketAction()) != 1 || resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule() != 0 {
				// BlanketRule 0 is ALLOW_ALL.
				t.Errorf("RLQS answer %v, want one allow_all assignment", resp)
			}
			_ = stream.CloseSend()
			redis.Kill()
			waitFor(t, "not ready with Redis down", func() bool { code, _ := get(t, s.ready); return code >= 500 })
			waitFor(t, "gRPC health NOT_SERVING with Redis down", func() bool {
				st, err := healthCheck(t, conn, "")
				return err == nil && st == healthpb.HealthCheckResponse_NOT_SERVING
			})
		})
	}
}

// TestModesDrain: in both modes, a stop (SIGTERM) makes the service not
// ready at once and waits for the call in flight, which is answered; then
// the run returns nil.
func TestModesDrain(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			redis := redistest.Start(t)
			s := m.start(t, modeOptions{redis: redis.Addr, logw: io.Discard})
			waitFor(t, "ready", func() bool { code, _ := get(t, s.ready); return code == http.StatusOK })
			rc := rlsv3.NewRateLimitServiceClient(s.conn(t))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if _, err := rc.ShouldRateLimit(ctx, s.call); err != nil {
				t.Fatalf("a call before the stop: %v", err)
			}

			redis.Freeze() // the next call waits for Redis
			thawed := false
			defer func() {
				if !thawed {
					redis.Thaw()
				}
			}()
			type answer struct {
				r   *rlsv3.RateLimitResponse
				err error
			}
			answered := make(chan answer, 1)
			go func() {
				r, err := rc.ShouldRateLimit(ctx, s.call)
				answered <- answer{r, err}
			}()
			waitFor(t, "the call in flight", func() bool {
				_, body := get(t, s.metrics)
				return metricValue(body, "tokengate_rls_grpc_calls_in_flight") == 1
			})
			s.stop()
			waitFor(t, "not ready once stopping", func() bool { code, _ := get(t, s.ready); return code >= 500 })
			select {
			case err := <-s.done:
				t.Fatalf("the run returned (%v) with a call in flight", err)
			case a := <-answered:
				t.Fatalf("the call was answered (%v %v) while Redis is frozen", a.r, a.err)
			default:
			}
			redis.Thaw()
			thawed = true
			a := <-answered
			if a.err != nil || a.r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Errorf("the call in flight across the stop: %v %v, want OK", a.r, a.err)
			}
			select {
			case err := <-s.done:
				if err != nil {
					t.Errorf("run after the drain: %v, want nil", err)
				}
				s.done <- nil
			case <-time.After(20 * time.Second):
				t.Fatal("the run did not return within 20 s of the last call")
			}
		})
	}
}

// TestModesTLSReload: in both modes a certificate written over the files
// serves new connections without a restart, and a bad file in between is
// logged once, however many times it is looked at, while the certificate
// in use stays.
func TestModesTLSReload(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			pki := newPKI(t)
			logw := &lockedLog{}
			s := m.start(t, modeOptions{redis: "127.0.0.1:1", cert: pki.certFile, key: pki.keyFile, logw: logw})
			serial := func() string {
				c, err := tls.Dial("tcp", s.grpc, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
			}
			if got := serial(); got != "2" {
				t.Fatalf("serial %s, want 2", got)
			}
			const notReloaded = "TLS files not reloaded"
			writeFile(t, pki.certFile, "not a certificate")
			waitFor(t, "the bad file logged", func() bool { return strings.Contains(logw.String(), notReloaded) })
			// Polls go on (every 50 ms, every second for the drop-in)
			// while the file stays bad.
			time.Sleep(2500 * time.Millisecond)
			if got := serial(); got != "2" {
				t.Errorf("serial %s with a bad file, want 2 (the one in use stays)", got)
			}
			writeSelfSigned(t, pki.certFile, pki.keyFile, 9)
			waitFor(t, "the new certificate served", func() bool { return serial() == "9" })
			if n := strings.Count(logw.String(), notReloaded); n != 1 {
				t.Errorf("%q logged %d times, want once:\n%s", notReloaded, n, logw.String())
			}
		})
	}
}

// writeSelfSigned writes a new self-signed key pair of serial over cert
// and key (renamed into place, key first).
func writeSelfSigned(t *testing.T, cert, key string, serial int64) {
	t.Helper()
	dir := t.TempDir()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(k)
	certTmp, keyTmp := filepath.Join(dir, "c"), filepath.Join(dir, "k")
	_ = os.WriteFile(certTmp, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	_ = os.WriteFile(keyTmp, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600)
	if err := errors.Join(os.Rename(keyTmp, key), os.Rename(certTmp, cert)); err != nil {
		t.Fatal(err)
	}
}
