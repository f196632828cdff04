package wasmimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeModule is a minimal binary Wasm module: the header and a custom
// section, so that it is not all zeros.
var fakeModule = append(append([]byte{}, wasmMagic...), 0x00, 0x05, 0x04, 't', 'e', 's', 't')

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// checkLayout checks that every file under blobs/sha256 is named after its
// digest and that index.json names the manifest under tag.
func checkLayout(t *testing.T, dir, tag string, img *Image) {
	t.Helper()
	layout, err := os.ReadFile(filepath.Join(dir, "oci-layout"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(layout)); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout %s", got)
	}
	entries, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(img.Blobs) {
		t.Errorf("%d blobs on disk, image has %d", len(entries), len(img.Blobs))
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if got := sha(b); got != "sha256:"+e.Name() {
			t.Errorf("blob %s has digest %s", e.Name(), got)
		}
	}
	var idx Index
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	if idx.SchemaVersion != 2 || idx.MediaType != MediaTypeIndex || len(idx.Manifests) != 1 {
		t.Fatalf("index.json: %s", b)
	}
	md := idx.Manifests[0]
	if md.MediaType != MediaTypeManifest || md.Annotations[AnnotationRefName] != tag {
		t.Errorf("index manifest descriptor %+v", md)
	}
	mb, err := os.ReadFile(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(md.Digest, "sha256:")))
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(mb)) != md.Size || sha(mb) != md.Digest || md.Digest != img.ManifestDescriptor.Digest {
		t.Errorf("manifest descriptor %+v does not describe the manifest blob", md)
	}
}

func TestCompatImage(t *testing.T) {
	dir := t.TempDir()
	img, err := Build(fakeModule, Options{Tag: "0.1.0", Annotations: map[string]string{"org.opencontainers.image.source": "https://github.com/tokengate/tokengate"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := img.WriteLayout(dir); err != nil {
		t.Fatal(err)
	}
	checkLayout(t, dir, "0.1.0", img)

	m := img.Manifest
	if m.SchemaVersion != 2 || m.MediaType != MediaTypeManifest {
		t.Errorf("manifest schemaVersion %d mediaType %q", m.SchemaVersion, m.MediaType)
	}
	if m.Annotations[AnnotationVariant] != "compat" || m.Annotations["org.opencontainers.image.source"] == "" {
		t.Errorf("manifest annotations %v", m.Annotations)
	}
	if m.Config.MediaType != MediaTypeImageConfig {
		t.Errorf("config media type %q", m.Config.MediaType)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != MediaTypeLayerTarGz {
		t.Fatalf("layers %+v, want one %s", m.Layers, MediaTypeLayerTarGz)
	}

	// The layer is a gzip'd tar holding exactly plugin.wasm, the module.
	layer := img.Blobs[m.Layers[0].Digest]
	zr, err := gzip.NewReader(bytes.NewReader(layer))
	if err != nil {
		t.Fatal(err)
	}
	tarball, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(tarball))
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(tr)
	if h.Name != "plugin.wasm" || h.Typeflag != tar.TypeReg || !bytes.Equal(got, fakeModule) {
		t.Errorf("layer holds %q (%d bytes), want plugin.wasm with the module", h.Name, len(got))
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("layer holds more than plugin.wasm: %v", err)
	}

	// The config's diff_id is the digest of the uncompressed layer.
	var cfg imageConfig
	if err := json.Unmarshal(img.Blobs[m.Config.Digest], &cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != sha(tarball) || cfg.RootFS.Type != "layers" {
		t.Errorf("config rootfs %+v, want diff_ids [%s]", cfg.RootFS, sha(tarball))
	}

	module, rm, err := ReadLayout(dir, "0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(module, fakeModule) || rm.Annotations[AnnotationVariant] != "compat" {
		t.Errorf("ReadLayout: %d bytes, annotations %v", len(module), rm.Annotations)
	}
}

func TestOCIImage(t *testing.T) {
	dir := t.TempDir()
	img, err := Build(fakeModule, Options{Variant: OCI})
	if err != nil {
		t.Fatal(err)
	}
	if err := img.WriteLayout(dir); err != nil {
		t.Fatal(err)
	}
	checkLayout(t, dir, "latest", img)
	m := img.Manifest
	if m.Config.MediaType != MediaTypeWasmConfig {
		t.Errorf("config media type %q", m.Config.MediaType)
	}
	if len(m.Layers) != 2 || m.Layers[0].MediaType != MediaTypeWasmConfig || m.Layers[1].MediaType != MediaTypeWasmContent {
		t.Fatalf("layers %+v", m.Layers)
	}
	if !bytes.Equal(img.Blobs[m.Layers[1].Digest], fakeModule) || m.Layers[1].Digest != sha(fakeModule) {
		t.Error("the content layer is not the raw module")
	}
	var rc runtimeConfig
	if err := json.Unmarshal(img.Blobs[m.Config.Digest], &rc); err != nil || rc.Type != "envoy_proxy" {
		t.Errorf("runtime config %s: %v", img.Blobs[m.Config.Digest], err)
	}
	module, _, err := ReadLayout(dir, "latest")
	if err != nil || !bytes.Equal(module, fakeModule) {
		t.Errorf("ReadLayout: %d bytes, %v", len(module), err)
	}
}

func TestBuildIsDeterministic(t *testing.T) {
	for _, v := range []Variant{Compat, OCI} {
		a, err := Build(fakeModule, Options{Variant: v, Tag: "x"})
		if err != nil {
			t.Fatal(err)
		}
		b, err := Build(fakeModule, Options{Variant: v, Tag: "x"})
		if err != nil {
			t.Fatal(err)
		}
		if a.ManifestDescriptor.Digest != b.ManifestDescriptor.Digest {
			t.Errorf("%s: two builds give %s and %s", v, a.ManifestDescriptor.Digest, b.ManifestDescriptor.Digest)
		}
	}
}

func TestBuildRejects(t *testing.T) {
	if _, err := Build([]byte("#!/bin/sh\n"), Options{}); err == nil || !strings.Contains(err.Error(), "not a binary Wasm module") {
		t.Errorf("non-wasm input: %v", err)
	}
	if _, err := Build(fakeModule, Options{Variant: "docker"}); err == nil || !strings.Contains(err.Error(), `unknown variant "docker"`) {
		t.Errorf("unknown variant: %v", err)
	}
}

func TestReadLayoutRejects(t *testing.T) {
	build := func(t *testing.T) (string, *Image) {
		dir := t.TempDir()
		img, err := Build(fakeModule, Options{Tag: "v1"})
		if err != nil {
			t.Fatal(err)
		}
		if err := img.WriteLayout(dir); err != nil {
			t.Fatal(err)
		}
		return dir, img
	}
	t.Run("unknown tag", func(t *testing.T) {
		dir, _ := build(t)
		if _, _, err := ReadLayout(dir, "v2"); err == nil || !strings.Contains(err.Error(), `no manifest named "v2"`) {
			t.Errorf("got %v", err)
		}
	})
	t.Run("corrupt blob", func(t *testing.T) {
		dir, img := build(t)
		p := filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(img.Manifest.Layers[0].Digest, "sha256:"))
		b, _ := os.ReadFile(p)
		b[len(b)-1] ^= 0xff
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := ReadLayout(dir, "v1"); err == nil || !strings.Contains(err.Error(), "has digest") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("layer media type neither variant accepts", func(t *testing.T) {
		dir, img := build(t)
		m := img.Manifest
		m.Layers = []Descriptor{m.Layers[0]}
		m.Layers[0].MediaType = "application/vnd.oci.image.layer.v1.tar"
		mj, _ := json.Marshal(m)
		img.Manifest = m
		img.ManifestDescriptor = img.add(MediaTypeManifest, mj, nil)
		if err := img.WriteLayout(dir); err != nil {
			t.Fatal(err)
		}
		if _, _, err := ReadLayout(dir, "v1"); err == nil || !strings.Contains(err.Error(), "neither variant") {
			t.Errorf("got %v", err)
		}
	})
}
