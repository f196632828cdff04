package rlsimage

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokengate/tokengate/internal/testsupport/testport"
)

// readLayout opens the layout at dir the way crane does and returns its
// one top-level descriptor.
func readLayout(t *testing.T, dir string) (layout.Path, v1.Descriptor) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("index.json has %d manifests, want 1", len(m.Manifests))
	}
	return p, m.Manifests[0]
}

// files extracts the image's file system: name → header and contents.
func files(t *testing.T, img v1.Image) map[string]struct {
	hdr  *tar.Header
	body []byte
} {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]struct {
		hdr  *tar.Header
		body []byte
	}{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = struct {
			hdr  *tar.Header
			body []byte
		}{h, body}
	}
	return out
}

// TestImage builds tokengate-rls for this machine's architecture, writes
// the image as an OCI layout, reads it back, checks its configuration and
// file system, and runs the binary taken out of the layer.
func TestImage(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the image is for Linux; its binary runs only there")
	}
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	binPath := filepath.Join(tmp, "tokengate-rls")
	if err := BuildBinary(root, "linux", runtime.GOARCH, binPath); err != nil {
		t.Fatal(err)
	}
	img, idx, err := Build([]Binary{{OS: "linux", Architecture: runtime.GOARCH, Variant: Variant(runtime.GOARCH), Path: binPath}},
		Options{Tag: "test", Version: "0.0.0-test"})
	if err != nil {
		t.Fatal(err)
	}
	if idx != nil {
		t.Fatal("one binary gave an index, want an image")
	}
	dir := filepath.Join(tmp, "oci")
	if err := WriteLayout(dir, "test", img, nil); err != nil {
		t.Fatal(err)
	}

	p, desc := readLayout(t, dir)
	if got := desc.Annotations[AnnotationRefName]; got != "test" {
		t.Errorf("ref.name = %q, want test", got)
	}
	if desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s, want %s", desc.MediaType, types.OCIManifestSchema1)
	}
	back, err := p.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (nonroot)", c.User)
	}
	if len(c.Entrypoint) != 1 || c.Entrypoint[0] != "/bin/tokengate-rls" {
		t.Errorf("entrypoint %q, want [/bin/tokengate-rls]", c.Entrypoint)
	}
	if len(c.Cmd) != 0 {
		t.Errorf("cmd %q, want none", c.Cmd)
	}
	for _, port := range []string{"8081/tcp", "9901/tcp"} {
		if _, ok := c.ExposedPorts[port]; !ok {
			t.Errorf("port %s not exposed (ports %v)", port, c.ExposedPorts)
		}
	}
	if len(c.ExposedPorts) != 2 {
		t.Errorf("exposed ports %v, want 8081/tcp and 9901/tcp only", c.ExposedPorts)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if got := c.Labels["org.opencontainers.image.version"]; got != "0.0.0-test" {
		t.Errorf("version label %q", got)
	}
	layers, err := back.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Errorf("layer media type %s, want %s", mt, types.OCILayer)
	}

	fs := files(t, back)
	bin, ok := fs["bin/tokengate-rls"]
	if !ok {
		t.Fatalf("no bin/tokengate-rls in the layer (files: %v)", keys(fs))
	}
	if bin.hdr.Typeflag != tar.TypeReg || bin.hdr.Mode&0o777 != 0o755 || bin.hdr.Uid != 0 {
		t.Errorf("bin/tokengate-rls: type %c mode %o uid %d, want a regular file 0755 owned by root", bin.hdr.Typeflag, bin.hdr.Mode, bin.hdr.Uid)
	}
	if l, ok := fs["bin/ratelimit"]; !ok || l.hdr.Typeflag != tar.TypeSymlink || l.hdr.Linkname != "tokengate-rls" {
		t.Errorf("bin/ratelimit is not a link to tokengate-rls: %+v", l.hdr)
	}
	for _, sh := range []string{"bin/sh", "bin/bash", "bin/busybox"} {
		if _, ok := fs[sh]; ok {
			t.Errorf("the image has %s; it should hold no shell", sh)
		}
	}
	if pw := string(fs["etc/passwd"].body); !strings.Contains(pw, ":65532:65532:") || !strings.Contains(pw, ":65534:65534:") {
		t.Errorf("etc/passwd names neither nonroot nor nobody:\n%s", pw)
	}
	if tmpd := fs["tmp"]; tmpd.hdr == nil || tmpd.hdr.Mode&0o1777 != 0o1777 {
		t.Errorf("tmp is not a 1777 directory")
	}
	assertStatic(t, bin.body)

	// The binary out of the layer runs: it prints its flags, then it starts,
	// answers an RLS call and stops on SIGTERM.
	exe := filepath.Join(tmp, "rootfs-bin", "tokengate-rls")
	if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, bin.body, 0o755); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(exe, "-help").CombinedOutput()
	for _, flag := range []string{"-config", "-listen", "-admin", "-redis"} {
		if !bytes.Contains(out, []byte(flag)) {
			t.Errorf("-help does not mention %s:\n%s", flag, out)
		}
	}
	runBinary(t, exe, filepath.Join(root, "deploy", "rls", "tokengate.json"))
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// assertStatic fails unless the ELF binary has no interpreter and needs no
// shared library: it runs in an image with nothing but itself.
func assertStatic(t *testing.T, bin []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("bin/tokengate-rls is not an ELF file: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("bin/tokengate-rls has an ELF interpreter: it is dynamically linked (build with CGO_ENABLED=0)")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) != 0 {
		t.Errorf("bin/tokengate-rls needs shared libraries %v", libs)
	}
}

// freePort returns a loopback port reserved for the test (testport).
func freePort(t *testing.T) string {
	t.Helper()
	return strconv.Itoa(testport.Free(t))
}

// runBinary starts the binary with no Redis behind it (the service starts
// without one and keeps trying), waits for its admin listener, makes one
// RLS call for a domain no rule names (answered OK without Redis), and
// stops it with SIGTERM.
func runBinary(t *testing.T, exe, config string) {
	t.Helper()
	grpcAddr := "127.0.0.1:" + freePort(t)
	adminAddr := "127.0.0.1:" + freePort(t)
	var logs bytes.Buffer
	cmd := exec.Command(exe, "-config", config, "-redis", "127.0.0.1:1",
		"-listen", grpcAddr, "-admin", adminAddr)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed once the process is gone; waitErr is then its
	// exit status.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	// Up to 600 polls 100 ms apart: a bound on a hung start, not a timing.
	client := &http.Client{Timeout: 2 * time.Second}
	up := false
	for i := 0; i < 600 && !up; i++ {
		select {
		case <-exited:
			t.Fatalf("tokengate-rls exited before serving: %v\n%s", waitErr, logs.Bytes())
		default:
		}
		resp, err := client.Get("http://" + adminAddr + "/metrics")
		if err == nil {
			resp.Body.Close()
			up = resp.StatusCode == http.StatusOK
		}
		if !up {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !up {
		t.Fatalf("the admin listener never answered /metrics 200\n%s", logs.Bytes())
	}

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain:      "no-rule-names-this-domain",
		Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}},
	})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v\n%s", err, logs.Bytes())
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("overall code %v, want OK", resp.GetOverallCode())
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", waitErr, logs.Bytes())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("still running 60 s after SIGTERM\n%s", logs.Bytes())
	}
}

// fakeBinary writes a stand-in binary for the tests that only package.
func fakeBinary(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func digestOf(t *testing.T, img v1.Image, idx v1.ImageIndex) v1.Hash {
	t.Helper()
	var h v1.Hash
	var err error
	if img != nil {
		h, err = img.Digest()
	} else {
		h, err = idx.Digest()
	}
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestReproducible(t *testing.T) {
	bin := fakeBinary(t, "not really a binary")
	b := []Binary{{OS: "linux", Architecture: "amd64", Path: bin}}
	img1, _, err := Build(b, Options{Tag: "x"})
	if err != nil {
		t.Fatal(err)
	}
	img2, _, err := Build(b, Options{Tag: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if d1, d2 := digestOf(t, img1, nil), digestOf(t, img2, nil); d1 != d2 {
		t.Errorf("two builds of the same binary: %s and %s", d1, d2)
	}
	other, _, err := Build([]Binary{{OS: "linux", Architecture: "amd64", Path: fakeBinary(t, "another binary")}}, Options{Tag: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if digestOf(t, img1, nil) == digestOf(t, other, nil) {
		t.Error("two different binaries gave the same digest")
	}
}

func TestMultiPlatformIndex(t *testing.T) {
	bins := []Binary{
		{OS: "linux", Architecture: "amd64", Path: fakeBinary(t, "amd64")},
		{OS: "linux", Architecture: "arm64", Variant: "v8", Path: fakeBinary(t, "arm64")},
	}
	img, idx, err := Build(bins, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if img != nil || idx == nil {
		t.Fatal("two binaries: want an index and no image")
	}
	dir := filepath.Join(t.TempDir(), "oci")
	if err := WriteLayout(dir, "multi", nil, idx); err != nil {
		t.Fatal(err)
	}
	p, desc := readLayout(t, dir)
	if desc.MediaType != types.OCIImageIndex {
		t.Fatalf("top-level media type %s, want an OCI index", desc.MediaType)
	}
	back, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	inner, err := back.ImageIndex(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := inner.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 2 {
		t.Fatalf("%d manifests, want 2", len(m.Manifests))
	}
	for i, d := range m.Manifests {
		want := bins[i]
		if d.Platform == nil || d.Platform.OS != want.OS || d.Platform.Architecture != want.Architecture || d.Platform.Variant != want.Variant {
			t.Errorf("manifest %d platform %+v, want %s/%s/%s", i, d.Platform, want.OS, want.Architecture, want.Variant)
			continue
		}
		sub, err := inner.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := sub.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != want.Architecture {
			t.Errorf("manifest %d config architecture %s, want %s", i, cf.Architecture, want.Architecture)
		}
		if got := string(files(t, sub)["bin/tokengate-rls"].body); got != want.Architecture {
			t.Errorf("manifest %d holds the binary %q, want %q", i, got, want.Architecture)
		}
	}
}

func TestBuildRefuses(t *testing.T) {
	bin := fakeBinary(t, "x")
	for _, tc := range []struct {
		name string
		bins []Binary
		opt  Options
	}{
		{"no binary", nil, Options{}},
		{"same platform twice", []Binary{{OS: "linux", Architecture: "amd64", Path: bin}, {OS: "linux", Architecture: "amd64", Path: bin}}, Options{}},
		{"missing binary", []Binary{{OS: "linux", Architecture: "amd64", Path: bin + ".missing"}}, Options{}},
		{"missing CA bundle", []Binary{{OS: "linux", Architecture: "amd64", Path: bin}}, Options{CABundle: bin + ".missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := Build(tc.bins, tc.opt); err == nil {
				t.Error("Build succeeded, want an error")
			}
		})
	}
}

func TestCABundle(t *testing.T) {
	ca := fakeBinary(t, "-----BEGIN CERTIFICATE-----\n...\n")
	img, _, err := Build([]Binary{{OS: "linux", Architecture: "amd64", Path: fakeBinary(t, "x")}}, Options{CABundle: ca})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(files(t, img)["etc/ssl/certs/ca-certificates.crt"].body); !strings.HasPrefix(got, "-----BEGIN CERTIFICATE-----") {
		t.Errorf("ca-certificates.crt = %q", got)
	}
}
