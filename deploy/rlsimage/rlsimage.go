// Package rlsimage builds the container image of tokengate-rls with Go
// tooling alone (go build and go-containerregistry; no Docker, no base
// image) and writes it as an OCI image layout directory that `crane push`
// or `oras cp --from-oci-layout` sends to any registry.
//
// The image holds one layer:
//
//	/bin/tokengate-rls       the static binary (CGO_ENABLED=0), mode 0755
//	/bin/ratelimit           a symbolic link to it: started under that name
//	                         it reads envoyproxy/ratelimit's environment, so
//	                         the image replaces envoyproxy/ratelimit where a
//	                         controller (Envoy Gateway) starts /bin/ratelimit
//	/etc/passwd, /etc/group  root, nonroot (65532) and nobody (65534), so
//	                         that either user has a name
//	/etc/ssl/certs/ca-certificates.crt
//	                         only when Options.CABundle is set: the roots Go
//	                         reads for a Redis TLS server signed by a public CA
//	/tmp                     mode 1777
//
// The configuration runs /bin/tokengate-rls as 65532:65532 (nonroot; a pod
// may run it as any other uid, e.g. Envoy Gateway's 65534: every file is
// world-readable and the binary world-executable), exposes 8081/tcp (gRPC)
// and 9901/tcp (admin HTTP), and sets no shell: there is none.
//
// The build is reproducible: the same binaries and options give the same
// digests (every file time is Options.Created, the Unix epoch by default).
package rlsimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Paths and settings of the image.
const (
	// BinaryPath is where the binary lives and the entrypoint.
	BinaryPath = "/bin/tokengate-rls"
	// RatelimitPath is the drop-in's name: a link to BinaryPath.
	RatelimitPath = "/bin/ratelimit"
	// User is the configuration's user: distroless's "nonroot".
	User = "65532:65532"
	// GRPCPort and AdminPort are the ports the image exposes, the ones the
	// Helm chart passes to -listen and -admin.
	GRPCPort  = 8081
	AdminPort = 9901

	// AnnotationRefName names an image in the layout's index.json.
	AnnotationRefName = "org.opencontainers.image.ref.name"
)

// Binary is tokengate-rls built for one platform.
type Binary struct {
	// OS and Architecture are GOOS and GOARCH ("linux", "amd64"); Variant
	// is the OCI platform variant ("v8" for arm64), may be empty.
	OS, Architecture, Variant string
	// Path is the binary on disk.
	Path string
}

// Options control Build.
type Options struct {
	// Tag names the image in the layout (AnnotationRefName); "latest" when
	// empty.
	Tag string
	// Version is the org.opencontainers.image.version label, if not empty.
	Version string
	// Source is the org.opencontainers.image.source label, if not empty.
	Source string
	// CABundle is a PEM file of trusted roots copied to
	// /etc/ssl/certs/ca-certificates.crt; none when empty.
	CABundle string
	// Created is the image's creation time and every file's modification
	// time; the Unix epoch when zero, so that builds are reproducible.
	Created time.Time
}

// Build packages the binaries, one image per platform. With one binary it
// returns that image; with several, an OCI image index of them.
func Build(bins []Binary, opt Options) (v1.Image, v1.ImageIndex, error) {
	if len(bins) == 0 {
		return nil, nil, errors.New("no binary to package")
	}
	var caPEM []byte
	if opt.CABundle != "" {
		b, err := os.ReadFile(opt.CABundle)
		if err != nil {
			return nil, nil, err
		}
		caPEM = b
	}
	seen := map[string]bool{}
	var imgs []v1.Image
	for _, b := range bins {
		p := b.OS + "/" + b.Architecture + "/" + b.Variant
		if seen[p] {
			return nil, nil, fmt.Errorf("two binaries for %s", p)
		}
		seen[p] = true
		img, err := image(b, caPEM, opt)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p, err)
		}
		imgs = append(imgs, img)
	}
	if len(imgs) == 1 {
		return imgs[0], nil, nil
	}
	var idx v1.ImageIndex = empty.Index
	idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
	for i, img := range imgs {
		b := bins[i]
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add: img,
			Descriptor: v1.Descriptor{
				MediaType: types.OCIManifestSchema1,
				Platform:  &v1.Platform{OS: b.OS, Architecture: b.Architecture, Variant: b.Variant},
			},
		})
	}
	return nil, idx, nil
}

func image(b Binary, caPEM []byte, opt Options) (v1.Image, error) {
	bin, err := os.ReadFile(b.Path)
	if err != nil {
		return nil, err
	}
	created := opt.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()
	layerTar, err := rootfs(bin, caPEM, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = b.OS, b.Architecture, b.Variant
	cf.Created = v1.Time{Time: created}
	labels := map[string]string{
		"org.opencontainers.image.title":       "tokengate-rls",
		"org.opencontainers.image.description": "RLS v3 rate-limit service with token buckets in Redis",
	}
	if opt.Version != "" {
		labels["org.opencontainers.image.version"] = opt.Version
	}
	if opt.Source != "" {
		labels["org.opencontainers.image.source"] = opt.Source
	}
	cf.Config = v1.Config{
		User:       User,
		Entrypoint: []string{BinaryPath},
		WorkingDir: "/",
		Env:        []string{"PATH=/bin"},
		ExposedPorts: map[string]struct{}{
			fmt.Sprintf("%d/tcp", GRPCPort):  {},
			fmt.Sprintf("%d/tcp", AdminPort): {},
		},
		Labels: labels,
	}
	cf.History = []v1.History{{Created: v1.Time{Time: created}, CreatedBy: "deploy/rlsimage", Comment: "tokengate-rls, static"}}
	return mutate.ConfigFile(img, cf)
}

// rootfs is the layer's uncompressed tar.
func rootfs(bin, caPEM []byte, mtime time.Time) ([]byte, error) {
	type entry struct {
		hdr  tar.Header
		body []byte
	}
	dir := func(name string, mode int64) entry {
		return entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode}}
	}
	file := func(name string, mode int64, body []byte) entry {
		return entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body))}, body: body}
	}
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
	group := "root:x:0:\nnonroot:x:65532:\nnobody:x:65534:\n"
	entries := []entry{
		dir("bin", 0o755),
		file("bin/tokengate-rls", 0o755, bin),
		{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/ratelimit", Linkname: "tokengate-rls", Mode: 0o777}},
		dir("etc", 0o755),
		file("etc/group", 0o644, []byte(group)),
		file("etc/passwd", 0o644, []byte(passwd)),
		dir("tmp", 0o1777),
	}
	if caPEM != nil {
		entries = append(entries, dir("etc/ssl", 0o755), dir("etc/ssl/certs", 0o755),
			file("etc/ssl/certs/ca-certificates.crt", 0o644, caPEM))
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].hdr.Name < entries[j].hdr.Name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		h.ModTime = mtime
		h.Format = tar.FormatPAX
		h.Uname, h.Gname = "root", "root"
		if err := tw.WriteHeader(&h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteLayout writes img or idx (the one that is not nil) into a new OCI
// image layout at dir, named tag.
func WriteLayout(dir, tag string, img v1.Image, idx v1.ImageIndex) error {
	if tag == "" {
		tag = "latest"
	}
	if (img == nil) == (idx == nil) {
		return errors.New("want exactly one of an image and an index")
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	ann := layout.WithAnnotations(map[string]string{AnnotationRefName: tag})
	if img != nil {
		return p.AppendImage(img, ann)
	}
	return p.AppendIndex(idx, ann)
}

// BuildBinary compiles ./cmd/tokengate-rls of the module at root for
// goos/goarch into out: static (CGO_ENABLED=0), stripped, -trimpath, with
// the vtprotobuf tag the service's response encoder needs.
func BuildBinary(root, goos, goarch, out string) error {
	goTool := os.Getenv("GO")
	if goTool == "" {
		goTool = "go"
	}
	cmd := exec.Command(goTool, "build", "-trimpath", "-tags=vtprotobuf", "-ldflags=-s -w",
		"-o", out, "./cmd/tokengate-rls")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	if goarch == "arm" {
		cmd.Env = append(cmd.Env, "GOARM=7")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s/%s: %w\n%s", goos, goarch, err, stderr.Bytes())
	}
	return nil
}

// Variant is the OCI platform variant of a GOARCH ("v8" for arm64, "v7"
// for arm; none otherwise).
func Variant(goarch string) string {
	switch goarch {
	case "arm64":
		return "v8"
	case "arm":
		return "v7"
	}
	return ""
}

// RepoRoot is the repository root above dir: the nearest directory up
// from dir that holds cmd/tokengate-rls.
func RepoRoot(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if st, err := os.Stat(filepath.Join(d, "cmd", "tokengate-rls")); err == nil && st.IsDir() {
			return d, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", fmt.Errorf("no cmd/tokengate-rls above %s", dir)
		}
		d = up
	}
}
