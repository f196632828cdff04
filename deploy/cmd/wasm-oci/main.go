// Command wasm-oci packages a Wasm module as an OCI image in the Wasm image
// format Istio's WasmPlugin fetcher accepts and writes it as an OCI image
// layout directory, ready to push with oras or crane:
//
//	go run ./deploy/cmd/wasm-oci -wasm build/tokengate.wasm -out build/oci -tag 0.1.0
//	oras cp --from-oci-layout build/oci:0.1.0 registry.example.com/tokengate/tokengate:0.1.0
//	crane push build/oci registry.example.com/tokengate/tokengate:0.1.0
//
// After writing, it reads the layout back the way Istio does and checks that
// it gets the module back. It prints the manifest digest, which is the image
// digest the registry will report (use it in the WasmPlugin's sha256 or
// url @sha256:...).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/tokengate/tokengate/deploy/wasmimage"
)

type annotations map[string]string

func (a annotations) String() string { return fmt.Sprint(map[string]string(a)) }

func (a annotations) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return errors.New("want key=value")
	}
	a[k] = v
	return nil
}

func main() {
	wasm := flag.String("wasm", "build/tokengate.wasm", "the Wasm module to package")
	out := flag.String("out", "build/oci", "the OCI image layout directory to write")
	tag := flag.String("tag", "latest", "the image's name in the layout (org.opencontainers.image.ref.name)")
	variant := flag.String("variant", string(wasmimage.Compat), `"compat" (one tar+gzip layer holding plugin.wasm) or "oci" (Wasm artifact media types)`)
	ann := annotations{}
	flag.Var(ann, "annotation", "a manifest annotation key=value (repeatable)")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "wasm-oci: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if err := run(*wasm, *out, *tag, wasmimage.Variant(*variant), ann); err != nil {
		fmt.Fprintln(os.Stderr, "wasm-oci:", err)
		os.Exit(1)
	}
}

func run(wasmPath, out, tag string, variant wasmimage.Variant, ann map[string]string) error {
	module, err := os.ReadFile(wasmPath)
	if err != nil {
		return err
	}
	img, err := wasmimage.Build(module, wasmimage.Options{Variant: variant, Tag: tag, Annotations: ann})
	if err != nil {
		return err
	}
	if err := img.WriteLayout(out); err != nil {
		return err
	}
	back, _, err := wasmimage.ReadLayout(out, tag)
	if err != nil {
		return fmt.Errorf("reading back %s: %w", out, err)
	}
	if !bytes.Equal(back, module) {
		return fmt.Errorf("reading back %s: the module differs", out)
	}
	fmt.Printf("wrote %s (%s variant, tag %s)\nmanifest digest %s\n", out, variant, tag, img.ManifestDescriptor.Digest)
	fmt.Printf("push: oras cp --from-oci-layout %s:%s <registry>/<repository>:%s\n", out, tag, tag)
	fmt.Printf("  or: crane push %s <registry>/<repository>:%s\n", out, tag)
	return nil
}
