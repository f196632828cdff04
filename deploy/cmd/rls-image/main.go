// Command rls-image builds the container image of tokengate-rls with Go
// tooling alone (no Docker) and writes it as an OCI image layout directory:
//
//	go run ./deploy/cmd/rls-image -out build/oci-rls -tag 0.1.0
//	crane push build/oci-rls registry.example.com/tokengate/tokengate-rls:0.1.0
//
// It compiles ./cmd/tokengate-rls once per -platforms entry (static,
// stripped) and packages them with deploy/rlsimage: one image for one
// platform, an OCI image index for several. It prints the digest to pin in
// the Helm chart's image.digest.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tokengate/tokengate/deploy/rlsimage"
)

func main() {
	out := flag.String("out", "build/oci-rls", "the OCI image layout `directory` to write (replaced)")
	tag := flag.String("tag", "latest", "the image's name in the layout (org.opencontainers.image.ref.name)")
	platforms := flag.String("platforms", "linux/amd64,linux/arm64", "comma-separated GOOS/GOARCH `list` to build")
	version := flag.String("version", "", "org.opencontainers.image.version label")
	source := flag.String("source", "", "org.opencontainers.image.source label")
	ca := flag.String("ca-bundle", "", "PEM `file` of trusted roots to ship as /etc/ssl/certs/ca-certificates.crt (for Redis over TLS with a public CA)")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "rls-image: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if err := run(*out, *tag, *platforms, rlsimage.Options{Tag: *tag, Version: *version, Source: *source, CABundle: *ca}); err != nil {
		fmt.Fprintln(os.Stderr, "rls-image:", err)
		os.Exit(1)
	}
}

func run(out, tag, platforms string, opt rlsimage.Options) error {
	root, err := rlsimage.RepoRoot(".")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "rls-image")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var bins []rlsimage.Binary
	for _, p := range strings.Split(platforms, ",") {
		goos, goarch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || goos == "" || goarch == "" {
			return fmt.Errorf("-platforms: %q is not GOOS/GOARCH", p)
		}
		path := filepath.Join(tmp, goos+"-"+goarch)
		fmt.Printf("building tokengate-rls for %s/%s\n", goos, goarch)
		if err := rlsimage.BuildBinary(root, goos, goarch, path); err != nil {
			return err
		}
		bins = append(bins, rlsimage.Binary{OS: goos, Architecture: goarch, Variant: rlsimage.Variant(goarch), Path: path})
	}
	img, idx, err := rlsimage.Build(bins, opt)
	if err != nil {
		return err
	}
	if err := rlsimage.WriteLayout(out, tag, img, idx); err != nil {
		return err
	}
	var digest fmt.Stringer
	if img != nil {
		d, err := img.Digest()
		if err != nil {
			return err
		}
		digest = d
	} else {
		d, err := idx.Digest()
		if err != nil {
			return err
		}
		digest = d
	}
	fmt.Printf("wrote %s (tag %s)\ndigest %s\n", out, tag, digest)
	fmt.Printf("push: crane push %s <registry>/<repository>:%s\n", out, tag)
	fmt.Printf("  or: oras cp --from-oci-layout %s:%s <registry>/<repository>:%s\n", out, tag, tag)
	return nil
}
